"""Custom ``torch.autograd.Function``s inside ORT graphs (ORT's ``PythonOp`` nodes) on today's torch.

With the support on, ORT's exporter keeps each custom Function as one ``com.microsoft::PythonOp``
node; ORT's kernels then call back into Python to run the Function's ``forward`` (through
``Function.apply``, so ``ctx`` is real) and, for ``PythonOpGrad``, its own ``backward``. ORT reaches
Python through two C++ runners registered by address, which ORT's ``torch_interop_utils`` used to
provide; it no longer compiles against torch 2.13, so lightning_ort ships its own
(``csrc/custom_function_runner.cc``, built into the extension cache on first use). The runner hands
each call to :func:`_run_forward` / :func:`_run_backward` below, which use torch's public autograd API.

What ORT expects from the runners, and how it is met here:

- Tensors come and go as DLPack capsules; ORT owns the input buffers and its memory planner may
  reuse an input buffer as soon as the PythonOp has run. In training, every tensor input is
  therefore cloned before ``apply`` (a Function may keep its inputs for backward through
  ``save_for_backward`` or as ``ctx`` attributes), and any output or gradient that shares memory
  with a buffer ORT passed in is copied, unless ORT planned that reuse (``tensor_reuse_map``).
- The forward returns the autograd context first; ORT keeps it and passes it to the backward. It is
  also held in ``_PENDING`` until its backward has run (ORT checks that it is referenced twice).
- Gradients ORT does not produce (an output that does not reach the loss) are materialised as zeros
  unless the Function called ``ctx.set_materialize_grads(False)``, as in eager PyTorch; returned
  gradients are reduced/cast to their input's shape and dtype as PyTorch's engine does.

Over 300 lines because the runners' rules above (buffer ownership, the pending contexts, materialised
gradients) and the switch that decides whether the exporter keeps Functions as PythonOp nodes share the
runner's state; split, each half would reach into the other's.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.dlpack import from_dlpack, to_dlpack

from lightning_ort.engine.bootstrap import extensions, loader
from lightning_ort.errors import ORTSetupError

log = logging.getLogger(__name__)

_PYTHON_OP = "prim::PythonOp"
_OPSET = 1

# Why the support could not be turned on in this process (set by custom_function_support(None)).
_unavailable_reason: str | None = None

# Qualified name -> Function class given to ORT. ORT keeps the first class registered under a name
# for the whole process, so a different class with the same name (a redefined class) would run the
# wrong code; the export guard refuses it.
_registered: dict[str, type] = {}


@dataclass
class _Pending:
    """What a context's backward needs from its forward."""

    ctx: Any
    num_inputs: int
    inputs: list[tuple[torch.Size, torch.dtype] | None]  # per argument: tensor metadata, None for non-tensors
    outputs: list[tuple[torch.Size, torch.dtype, torch.device] | None]  # per output


_PENDING: dict[int, _Pending] = {}


class _UnsafeContext:
    """``ctx`` for ORT's "unsafe" PythonOps, which call ``forward`` directly (ORT-internal features only)."""


def qualified_name(cls: type) -> str:
    """The name ORT registers a Function under (``get_fully_qualified_class_name``)."""
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _shares_memory(tensor: torch.Tensor, other: torch.Tensor | None) -> bool:
    if other is None or tensor.device != other.device:
        return False
    storage, other_storage = tensor.untyped_storage(), other.untyped_storage()
    return storage.nbytes() > 0 and storage.data_ptr() == other_storage.data_ptr()


def _to_ort(
    value: Any, position: int, raw: list[torch.Tensor | None], reuse_map: list[int], offset: int, what: str
) -> Any:
    """DLPack capsule for a returned tensor, in memory ORT may keep (see the module docstring)."""
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{what} is a {type(value).__name__}; ORT's PythonOp passes only tensors and None")
    with torch.no_grad():
        value = value.detach()
        planned = reuse_map[position] if position < len(reuse_map) else -1
        target = raw[planned - offset] if 0 <= planned - offset < len(raw) else None
        if target is not None:
            # ORT planned this result into an input buffer (the Function declared the alias).
            if not _shares_memory(value, target) or value.data_ptr() != target.data_ptr():
                target.copy_(value)
            value = target.detach()
        elif any(_shares_memory(value, tensor) for tensor in raw):
            value = value.clone()
        if not value.is_contiguous():
            value = value.contiguous()
    return to_dlpack(value)


def _apply_of(callback: Any) -> Any:
    """``Function.apply`` as it is now.

    ORT stores ``cls.apply`` when the Function is exported, which is while lightning_ort's export
    guard wraps ``Function.apply``; calling it again through the class avoids that stale wrapper.
    """
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, type) and issubclass(owner, torch.autograd.Function):
        return owner.apply
    return callback


def _run_forward(
    callback: Any,
    func_name: str,
    args: list[Any],
    tensor_flags: list[int],
    requires_grad_flags: list[int],
    training: bool,
    reuse_map: list[int],
    safe_run: bool,
) -> list[Any]:
    raw: list[torch.Tensor | None] = []
    call_args: list[Any] = []
    inputs: list[tuple[torch.Size, torch.dtype] | None] = []
    for value, is_tensor, wants_grad in zip(args, tensor_flags, requires_grad_flags, strict=True):
        if not is_tensor:
            call_args.append(value)
            inputs.append(None)
            continue
        tensor = None if value is None else from_dlpack(value)
        raw.append(tensor)
        inputs.append(None if tensor is None else (tensor.shape, tensor.dtype))
        if tensor is not None and training:
            # A copy ORT cannot overwrite; a non-leaf when it needs grad, so mark_dirty() works.
            if wants_grad and (tensor.is_floating_point() or tensor.is_complex()):
                tensor.requires_grad_(True)
                with torch.enable_grad():
                    tensor = tensor.clone()
            else:
                tensor = tensor.clone()
        call_args.append(tensor)

    if safe_run:
        with torch.set_grad_enabled(training):
            result = _apply_of(callback)(*call_args)
    else:
        with torch.no_grad():
            unsafe_ctx = _UnsafeContext()
            result = callback(unsafe_ctx, *call_args)
    outputs = result if isinstance(result, tuple) else (result,)

    ctx: Any = None
    if training and safe_run:
        ctx = next((out.grad_fn for out in outputs if isinstance(out, torch.Tensor) and out.grad_fn is not None), None)
        if ctx is not None:
            meta = [(out.shape, out.dtype, out.device) if isinstance(out, torch.Tensor) else None for out in outputs]
            _PENDING[id(ctx)] = _Pending(ctx, len(args), inputs, meta)
    elif training:
        ctx = unsafe_ctx

    returned: list[Any] = [ctx]
    for index, out in enumerate(outputs):
        returned.append(_to_ort(out, index + 1, raw, reuse_map, 0, f"output {index} of {func_name}.forward"))
    return returned


def _reduce_like(grad: torch.Tensor, shape: torch.Size, dtype: torch.dtype, func_name: str, index: int) -> torch.Tensor:
    """What PyTorch's engine does with a gradient whose shape or dtype differs from its input's."""
    if grad.shape != shape:
        try:
            grad = grad.sum_to_size(shape)
        except RuntimeError as err:
            raise RuntimeError(
                f"{func_name}.backward returned a gradient of shape {tuple(grad.shape)} for input {index} of "
                f"shape {tuple(shape)}"
            ) from err
    return grad if grad.dtype == dtype else grad.to(dtype)


def _run_backward(
    callback: Any,
    func_name: str,
    args: list[Any],
    tensor_flags: list[int],
    requires_grad_flags: list[int],
    training: bool,
    reuse_map: list[int],
    safe_run: bool,
) -> list[Any]:
    ctx = args[0]
    pending = _PENDING.get(id(ctx)) if safe_run else None
    materialize = pending is not None and bool(_runner().materialize_grads(ctx))
    raw: list[torch.Tensor | None] = []
    grads: list[torch.Tensor | None] = []
    for index, value in enumerate(args[1:]):
        tensor = None if value is None or not tensor_flags[index + 1] else from_dlpack(value)
        raw.append(tensor)
        if tensor is None and materialize and pending is not None and index < len(pending.outputs):
            meta = pending.outputs[index]
            if meta is not None:
                tensor = torch.zeros(meta[0], dtype=meta[1], device=meta[2])
        grads.append(tensor)
    try:
        with torch.no_grad():
            result = callback(ctx, *grads)
    finally:
        if pending is not None:
            del _PENDING[id(ctx)]

    results = list(result) if isinstance(result, tuple) else [result]
    if pending is not None:
        expected = pending.num_inputs
        if len(results) > expected and all(value is None for value in results[expected:]):
            results = results[:expected]
        if len(results) != expected:
            raise RuntimeError(
                f"{func_name}.backward returned an incorrect number of gradients (expected {expected}, got "
                f"{len(results)})"
            )
        for index, (grad, meta) in enumerate(zip(results, pending.inputs, strict=True)):
            if isinstance(grad, torch.Tensor) and meta is not None:
                results[index] = _reduce_like(grad, meta[0], meta[1], func_name, index)
    return [
        _to_ort(grad, index, raw, reuse_map, 1, f"gradient {index} of {func_name}.backward")
        for index, grad in enumerate(results)
    ]


def clear_all_grad_fns() -> None:
    """Forget contexts whose backward never ran (ORT calls this at exit)."""
    _PENDING.clear()


_runner_module: types.ModuleType | None = None
_exit_hooks_registered = False


def _runner() -> types.ModuleType:
    """The compiled runner extension, built on first use, with the Python drivers set and its runners
    handed to ORT (what ORT's ``enable_custom_autograd_support`` does on its first call, which
    :func:`custom_function_support` keeps from asking ``torch_interop_utils``: that would build it)."""
    global _runner_module, _exit_hooks_registered
    if _runner_module is None:
        from onnxruntime.capi._pybind_state import (
            register_backward_runner,
            register_forward_runner,
            unregister_python_functions,
        )

        module = extensions.load_custom_function_runner()
        module.set_drivers(_run_forward, _run_backward)
        register_forward_runner(int(module.forward_runner_address()))
        register_backward_runner(int(module.backward_runner_address()))
        if not _exit_hooks_registered:
            atexit.register(unregister_python_functions)
            atexit.register(clear_all_grad_fns)
            _exit_hooks_registered = True
        _runner_module = module
    return _runner_module


def ensure_runner() -> None:
    """Build (or reuse) the runner extension and hand its runners to ORT, once per process.

    Called when a graph about to run holds PythonOp nodes, so that a model without custom Functions
    never compiles the runner. Raises :class:`~lightning_ort.errors.ORTSetupError` when it cannot be
    built, and again at once on later calls (the build is not retried).
    """
    global _unavailable_reason
    if _runner_module is not None:
        return
    if _unavailable_reason is not None:
        raise ORTSetupError(_unavailable_reason)
    try:
        _runner()
    except ORTSetupError as err:
        _unavailable_reason = str(err)
        raise


def interop_module(name: str) -> types.ModuleType:
    """The module ORT imports as ``torch_interop_utils``: what ORT's Python code calls on it."""
    module = types.ModuleType(name, "lightning_ort's replacement for ORT's torch_interop_utils extension.")

    def get_custom_function_forward_runner() -> int:
        return int(_runner().forward_runner_address())

    def get_custom_function_backward_runner() -> int:
        return int(_runner().backward_runner_address())

    module.get_custom_function_forward_runner = get_custom_function_forward_runner  # type: ignore[attr-defined]
    module.get_custom_function_backward_runner = get_custom_function_backward_runner  # type: ignore[attr-defined]
    module.clear_all_grad_fns = clear_all_grad_fns  # type: ignore[attr-defined]
    return module


def custom_function_support(enabled: bool | None = None) -> bool:
    """Turn custom ``torch.autograd.Function`` support inside ORT graphs on or off; return whether it is on.

    Applies to ORTModules created afterwards (each copies the setting when it is constructed).
    ``None`` turns it on when lightning_ort's runner extension is cached or can be built (a compiler,
    ninja and a writable cache), and off otherwise (modules applying custom Functions then fall back to
    PyTorch, and the fallback reason says why); the runner is then compiled only when a graph runs a
    custom Function (:func:`ensure_runner`). ``True`` builds it now and raises
    :class:`~lightning_ort.errors.ORTSetupError` when the extension is unavailable. With the support
    off, such modules are refused (ORT would inline the Function's forward and ignore its backward).
    """
    global _unavailable_reason
    loader.ortmodule_package()
    from onnxruntime.training.ortmodule import _custom_autograd_function

    if enabled is None and _unavailable_reason is not None:
        enabled = False  # the build failed earlier in this process; do not retry it for every module
    if enabled is not False:
        try:
            _check_torch_version()
            if enabled or _runner_module is not None or extensions.custom_function_runner_built():
                _runner()
            else:
                extensions.check_can_build()  # the build waits for a graph that runs a custom Function
            _import_exporter_dependencies()
        except ORTSetupError as err:
            if enabled:
                raise ORTSetupError(f"Custom autograd.Function support inside ORT is unavailable: {err}") from err
            _unavailable_reason = str(err)
            log.info("lightning_ort: custom autograd.Function support inside ORT is unavailable: %s", err)
            enabled = False
        else:
            _unavailable_reason = None
            enabled = True
    # _runner() hands ORT the runners; ORT's first enable would ask torch_interop_utils, building them.
    _custom_autograd_function.custom_autograd_function_enabler._already_enabled = True
    _custom_autograd_function.enable_custom_autograd_support(enabled)
    return bool(_custom_autograd_function.custom_autograd_function_enabler.state)


# The runner's backward failed on torch 2.11 ("Trying to backward through the graph a second time",
# seen on the 16-core machine); 2.13 is the version it is tested on.
_MIN_TORCH = (2, 13)


def _check_torch_version() -> None:
    release = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if release < _MIN_TORCH:
        raise ORTSetupError(
            f"it needs torch >= {'.'.join(map(str, _MIN_TORCH))} (installed: {torch.__version__}; on torch 2.11 "
            "the Functions' backward failed inside ORT). Fix: pip install 'torch>=2.13'; until then such modules "
            "train in PyTorch"
        )


def custom_function_support_enabled() -> bool:
    """Whether ORTModules created now get custom ``torch.autograd.Function`` support."""
    loader.ortmodule_package()
    from onnxruntime.training.ortmodule import _custom_autograd_function

    return bool(_custom_autograd_function.custom_autograd_function_enabler.state)


def _import_exporter_dependencies() -> None:
    """ORT's PythonOp exporter imports its hooks package on first use, which warns that DeepSpeed is
    missing; the warning would reach users through each export. DeepSpeed plays no part here."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="DeepSpeed import error")
        import onnxruntime.training.utils.hooks._statistics_subscriber  # noqa: F401


def support_off_reason() -> str:
    """Why custom Functions are not run by ORT in this process, for fallback messages."""
    if _unavailable_reason is not None:
        return f"custom autograd.Function support is unavailable: {_unavailable_reason}"
    return "custom autograd.Function support is off"


def check_registered(functions: list[type]) -> list[type]:
    """Functions whose qualified name ORT already holds for another class (ORT would run that one)."""
    clashes = []
    for cls in functions:
        known = _registered.setdefault(qualified_name(cls), cls)
        if known is not cls:
            clashes.append(cls)
    return clashes


@contextlib.contextmanager
def python_op_symbolic(training: bool | None) -> Iterator[None]:
    """Inside the block ``prim::PythonOp`` exports through ORT's PythonOp symbolic, in ``training`` mode.

    ORT registers the symbolic globally when the support is turned on, but an ORTModule created with
    the support on keeps exporting Functions as PythonOp (``autograd_inlining=False``) even if the
    support was turned off since. ORT's symbolic reads the export's training mode, which
    lightning_ort may have turned into ``TrainingMode.PRESERVE`` (see ``export_guard``); ``training``
    is the mode ORT asked for.
    """
    from onnxruntime.training.ortmodule import _custom_autograd_function_exporter as exporter
    from torch.onnx._internal.torchscript_exporter import registration

    with contextlib.ExitStack() as stack:
        if not registration.registry.is_registered_op(_PYTHON_OP, _OPSET):
            torch.onnx.register_custom_op_symbolic(_PYTHON_OP, exporter._export, _OPSET)
            stack.callback(torch.onnx.unregister_custom_op_symbolic, _PYTHON_OP, _OPSET)
        if training is not None:
            original = exporter._get_training_mode
            exporter._get_training_mode = lambda: training
            stack.callback(setattr, exporter, "_get_training_mode", original)
        yield
