"""What lightning_ort checks and restores around ORT's ONNX export of a module."""

from __future__ import annotations

import contextlib
import functools
import io
import linecache
import logging
import os
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import onnx
import torch
import torch.utils.checkpoint
from torch.onnx import TrainingMode

from lightning_ort.engine.bootstrap import custom_function
from lightning_ort.engine.export import hf_attention, python_random, python_reads, size_guards, trace_checks
from lightning_ort.engine.export.assert_statements import in_assert_condition
from lightning_ort.engine.export.checkpoint_regions import checkpointed_running_statistics
from lightning_ort.engine.export.grad_regions import GradRegions
from lightning_ort.engine.export.python_state import PythonState
from lightning_ort.engine.export.traced_calls import ORT_DIR, computed_from_inputs, graph_inputs_of, traced_calls
from lightning_ort.engine.export.tracing_state import untraced
from lightning_ort.engine.export.value_traces import exporting, value_trace
from lightning_ort.engine.ops.kernels.batchnorm import record_calls_per_forward
from lightning_ort.errors import ORTSetupError, ORTUnsupportedModelError

log = logging.getLogger(__name__)

# TorchScript tracing records one path through Python control flow that reads tensor values, and
# freezes such values as constants: the ORT graph would then compute something else than the module.
_UNSAFE_TRACER_PHRASES = (
    "might cause the trace to be incorrect",
    "registered as constants in the trace",
    "trace might not generalize",
)


# int(), float() or math of a size read from the input is such a value too, since the export traces sizes as tensors
_SIZES_ARE_TENSORS = (
    " (if it is a size: under the export a size such as x.shape[0] is a tensor too, so int(x.shape[0] / 4) or "
    "math.sqrt(x.size(1)) "
    "freezes the first batch's number. Fix: keep it a tensor (x.shape[0] // 4, x.size(1) ** 0.5), or compute it "
    "from a number the module keeps)"
)
_BRANCH_ON_SIZES = (
    "its forward has Python control flow on sizes at {location} ({line}): under the export sizes are tensors, "
    "and the graph would keep the branch the first batch took (lightning_ort checks such a branch on every call "
    "only where it can compute its sizes from forward's inputs). Fix: take the branch on every call (compute both "
    "sides with tensor operations, torch.where), or keep that module out of ORT with ORTStrategy(modules=[...])"
)
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_ONNX_DIR = os.path.join(_TORCH_DIR, "onnx") + os.sep
_ENGINE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # lightning_ort/engine/
# ORT turns Python numbers among forward's outputs into tensors here, under the trace (a TracerWarning)
_ORT_OUTPUT_FLATTENING = os.path.join(ORT_DIR, "training", "utils", "torch_io_helper.py")
_NUMBER_OUTPUT = (
    "its forward returns a Python number (int, float or bool) among its outputs; ORT's graph has tensor outputs "
    "only, and the export would freeze that number at its first value. Fix: return tensors only (compute the "
    "number with tensor operations), or compute the number outside forward (in training_step)"
)


def _is_unsafe_tracer_warning(record: warnings.WarningMessage) -> bool:
    # torch's own modules convert tensors to Python values only to validate inputs
    # (e.g. BatchNorm's batch-size check); the user's code is what can branch on data.
    if not issubclass(record.category, torch.jit.TracerWarning) or record.filename.startswith(_TORCH_DIR):
        return False
    text = str(record.message)
    if "boolean" in text and in_assert_condition(record.filename, record.lineno):
        return False  # an assertion that held: the graph is the same without it
    return any(phrase in text for phrase in _UNSAFE_TRACER_PHRASES)


@contextlib.contextmanager
def _record_autograd_functions() -> Iterator[list[type]]:
    """Record every custom ``torch.autograd.Function`` applied inside the block, outside other Functions.

    A Function applied inside another Function's ``forward`` runs within that one (whose backward is
    what counts), so only the outermost applications are recorded.
    """
    seen: list[type] = []
    depth = 0
    function_cls = torch.autograd.Function
    # A Python classmethod on torch 2.13, _C._FunctionBase's C classmethod (no __func__) on 2.14 and
    # newer; both bind to a subclass through __get__.
    original = function_cls.__dict__["apply"]

    @functools.wraps(getattr(original, "__func__", original))
    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        nonlocal depth
        # ORT applies identity Functions of its own while exporting; those export correctly.
        if depth == 0 and cls not in seen and not cls.__module__.startswith("onnxruntime."):
            seen.append(cls)
        depth += 1
        try:
            return original.__get__(None, cls)(*args, **kwargs)
        finally:
            depth -= 1

    function_cls.apply = classmethod(apply)  # type: ignore[method-assign,assignment]
    try:
        yield seen
    finally:
        function_cls.apply = original  # type: ignore[method-assign]


# ORT cannot export torch.utils.checkpoint's reentrant variant (a Function that recomputes its own
# PyTorch graph in backward); the non-reentrant one exports as the plain computation.
_REENTRANT_CHECKPOINT = (
    "it uses torch.utils.checkpoint with use_reentrant=True (torch.utils.checkpoint.CheckpointFunction), which "
    "ORT cannot export. Fix: use_reentrant=False (ORT then trains the checkpointed computation as part of its "
    "graph, without recomputation)"
)


@dataclass
class _ExportRecord:
    """What one ORT export did with custom autograd.Functions."""

    # ORT asked the exporter to keep Functions as PythonOp nodes (custom-Function support was on
    # when the ORTModule was created); otherwise their forward is inlined.
    keeps_functions: bool = False
    # Qualified names of the Functions that became PythonOp nodes.
    python_ops: set[str] = field(default_factory=set)
    # torch's exporter ran (no export served from the cache, export_cache.py): a trace happened.
    traced: bool = False


def _python_op_names(exported: Any) -> set[str]:
    if not isinstance(exported, io.BytesIO):
        return set()
    model = onnx.load_model_from_string(exported.getvalue())
    names = set()
    for node in model.graph.node:
        if node.domain == "com.microsoft" and node.op_type == "PythonOp":
            for attribute in node.attribute:
                if attribute.name == "func_name":
                    names.add(attribute.s.decode())
    return names


@contextlib.contextmanager
def _torchscript_exporter(record: _ExportRecord) -> Iterator[None]:
    """Inside the block ``torch.onnx.export`` uses the TorchScript exporter, which ORT 1.19 expects."""
    original = torch.onnx.export

    @functools.wraps(original)
    def export(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("dynamo", False)
        model = args[0] if args else kwargs.get("model")
        requested = kwargs.get("training")
        # TRAINING/EVAL make the exporter call model.train(mode) recursively, which would trace (and
        # afterwards leave) a frozen eval-mode BatchNorm or Dropout in training mode. When the top
        # module is already in the requested mode, PRESERVE keeps every submodule's own mode.
        if isinstance(model, torch.nn.Module) and requested in (TrainingMode.TRAINING, TrainingMode.EVAL):
            if model.training == (requested == TrainingMode.TRAINING):
                kwargs["training"] = TrainingMode.PRESERVE
        record.traced = True
        record.keeps_functions = kwargs.get("autograd_inlining") is False
        if not record.keeps_functions:
            return original(*args, **kwargs)
        from lightning_ort.engine.bootstrap.custom_function import python_op_symbolic

        training = (
            None if requested not in (TrainingMode.TRAINING, TrainingMode.EVAL) else requested == TrainingMode.TRAINING
        )
        with python_op_symbolic(training):
            result = original(*args, **kwargs)
        record.python_ops = _python_op_names(args[2] if len(args) > 2 else kwargs.get("f"))
        return result

    torch.onnx.export = export  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.onnx.export = original


def _functions_problem(functions: list[type], record: _ExportRecord) -> str | None:
    """Why the Functions the module applies would not train as in PyTorch under ORT, if they would not."""
    if not functions:
        return None
    names = ", ".join(f"{cls.__module__}.{cls.__qualname__}" for cls in functions)
    if not record.keeps_functions:
        return (
            f"it applies custom torch.autograd.Function(s) {names}; ORT would differentiate their forward "
            f"and ignore their custom backward ({custom_function.support_off_reason()})"
        )
    if record.python_ops:
        try:
            custom_function.ensure_runner()  # compiled now, the first time a graph runs a custom Function
        except ORTSetupError:
            return f"it applies custom torch.autograd.Function(s) {names} ({custom_function.support_off_reason()})"
    clashes = custom_function.check_registered(
        [cls for cls in functions if custom_function.qualified_name(cls) in record.python_ops]
    )
    # An ONNX `symbolic` (or one of ORT's special exporters) replaces the Function by ONNX operators,
    # which ORT differentiates itself: the custom backward would be ignored.
    inlined = [cls for cls in functions if custom_function.qualified_name(cls) not in record.python_ops]
    if inlined:
        names = ", ".join(f"{cls.__module__}.{cls.__qualname__}" for cls in inlined)
        return (
            f"custom torch.autograd.Function(s) {names} were exported as ONNX operators (e.g. through a "
            "`symbolic` method) instead of PythonOp nodes; ORT would differentiate those operators and ignore "
            "the custom backward"
        )
    if clashes:
        names = ", ".join(f"{cls.__module__}.{cls.__qualname__}" for cls in clashes)
        return (
            f"custom torch.autograd.Function(s) {names} have the qualified name of another Function class that "
            "ORT already runs in this process (a redefined class?); ORT would run the other class"
        )
    return None


def _batch_norm_state(module: torch.nn.Module) -> tuple[set[int], list[str]]:
    """Ids of BatchNorm buffers lightning_ort keeps in step with eager, and layers it cannot."""
    handled: set[int] = set()
    unsupported: list[str] = []
    for name, layer in module.named_modules():
        if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm) and layer.track_running_stats:
            if layer.momentum is None:
                unsupported.append(name.removeprefix("_original_module.") or type(layer).__name__)
            handled.update(id(buffer) for buffer in layer.buffers(recurse=False))
    return handled, unsupported


@contextlib.contextmanager
def attention_fast_path_off() -> Iterator[None]:
    """Trace nn.MultiheadAttention / nn.TransformerEncoder through their standard (math) path.

    In eval mode without grad, PyTorch takes fused fast paths (``_transformer_encoder_layer_fwd``,
    nested tensors) that ONNX cannot express. The standard path computes the same function; the one
    visible difference is that positions masked by ``src_key_padding_mask`` hold computed values
    instead of the fast path's zeros.
    """
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


def _user_frame() -> str | None:
    """``file:line`` of the innermost caller outside torch, this package and ORT, if any."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith((_TORCH_DIR, _ENGINE_DIR, ORT_DIR)) and not filename.startswith("<frozen"):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


_GRAD_MODE_FILE = torch.autograd.grad_mode.__file__
_TRACED_CALLS_FILE = sys.modules[traced_calls.__module__].__file__


@contextlib.contextmanager
def _record_grad_disabling(regions: GradRegions) -> Iterator[GradRegions]:
    """Where the traced forward turns gradients off: ``torch.no_grad()`` regions are told to ``regions`` as
    they open and close; any other way (``set_grad_enabled(False)``, ``inference_mode``) is unsafe at once."""
    original = torch._C._set_grad_enabled
    enter, leave = torch.no_grad.__enter__, torch.no_grad.__exit__

    def _set_grad_enabled(mode: bool) -> None:
        caller = sys._getframe(1)
        # past the torch function mode watching this call, which calls this function once more
        while caller.f_code.co_filename in (_TRACED_CALLS_FILE, __file__):
            caller = caller.f_back
        # the export traces with gradients off: leaving a `with torch.enable_grad():` turns them off again
        restoring = caller.f_code.co_name == "__exit__" and caller.f_code.co_filename == _GRAD_MODE_FILE
        if not mode and not restoring and torch.jit.is_tracing() and not _in_no_grad(caller):
            location = _user_frame()
            if location is not None and location not in regions.switched:
                regions.switched.append(location)
        original(mode)

    def no_grad_enter(self: torch.no_grad) -> None:
        if torch.jit.is_tracing():
            regions.enter(_user_frame())
        enter(self)

    def no_grad_exit(self: torch.no_grad, *args: Any) -> None:
        try:
            leave(self, *args)
        finally:
            if torch.jit.is_tracing():
                regions.leave()

    torch._C._set_grad_enabled = _set_grad_enabled
    torch.no_grad.__enter__ = no_grad_enter  # type: ignore[method-assign]
    torch.no_grad.__exit__ = no_grad_exit  # type: ignore[method-assign]
    try:
        yield regions
    finally:
        torch._C._set_grad_enabled = original
        torch.no_grad.__enter__ = enter  # type: ignore[method-assign]
        torch.no_grad.__exit__ = leave  # type: ignore[method-assign]


def _in_no_grad(frame: types.FrameType | None) -> bool:
    """Whether ``frame`` or one of its callers (a few up) is ``torch.no_grad``'s own ``__enter__``/``__exit__``."""
    for _ in range(4):
        if frame is None:
            return False
        if frame.f_code.co_name in ("__enter__", "__exit__") and isinstance(frame.f_locals.get("self"), torch.no_grad):
            return True
        frame = frame.f_back
    return False


def _computed_from_inputs(tensor: torch.Tensor) -> bool:
    """Whether the open trace computes ``tensor`` from the graph's inputs (the batch, the parameters),
    not from constants alone (a causal mask cached on first use)."""
    value = value_trace(tensor)
    return value is not None and computed_from_inputs(value)


@contextlib.contextmanager
def _record_stored_tensors(module: torch.nn.Module, state: PythonState) -> Iterator[list[str]]:
    """Where the traced forward stores tensors computed from its inputs on a module (an auxiliary loss read
    after forward, a memory for the next step): the ORT graph would never assign them again."""
    stored: list[str] = []

    def check_stored(traced: torch.nn.Module, args: Any, output: Any) -> None:  # while the trace is open
        if torch.jit.is_tracing():
            stored.extend(where for where in state.stored(_computed_from_inputs) if where not in stored)

    handle = module.register_forward_hook(check_stored)
    try:
        yield stored
    finally:
        handle.remove()


@contextlib.contextmanager
def _traced_batch_norm_calls(module: torch.nn.Module, exported: _ExportRecord) -> Iterator[None]:
    """Record how often the traced forward ran each BatchNorm layer, from how far it advanced the layer's
    ``num_batches_tracked`` (ORT's graph cannot advance it; batchnorm.py does, per call). Only the trace's
    forward counts: ORT runs a module it cannot deep-copy (a pruned one) once more for its output schema."""
    layers = [
        layer
        for layer in module.modules()
        if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm) and layer.num_batches_tracked is not None
    ]
    starts: dict[torch.nn.Module, int] = {}
    counts: dict[torch.nn.Module, int] = {}

    def batches() -> dict[torch.nn.Module, int]:
        with untraced():  # read as numbers, not trace nodes
            return {layer: int(layer.num_batches_tracked) for layer in layers}

    def started(traced: torch.nn.Module, args: Any) -> None:
        if torch.jit.is_tracing():
            starts.update(batches())

    def ended(traced: torch.nn.Module, args: Any, output: Any) -> None:
        if torch.jit.is_tracing():
            counts.update((layer, count - starts[layer]) for layer, count in batches().items())

    handles = [module.register_forward_pre_hook(started), module.register_forward_hook(ended)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        if module.training and exported.traced:  # a cached export's counts come from its trace record
            for layer in layers:
                record_calls_per_forward(layer, counts.get(layer, 0))


@contextlib.contextmanager
def _preserved_buffers(
    module: torch.nn.Module, exported: _ExportRecord
) -> Iterator[tuple[list[str], list[str], Callable[[], list[str]]]]:
    """Undo buffer updates made by the forward runs the export does (in place or by assigning a new
    tensor); list the buffers they changed in place, and those they replaced. The third item names the
    buffers written in place so far, for an export that failed before the block ends.

    BatchNorm statistics are updated correctly inside the ORT graph (see ``batchnorm.py``); any
    other buffer a forward writes in place would silently stop being updated under ORT.
    """
    saved = [(name, buffer, buffer.detach().clone()) for name, buffer in module.named_buffers()]
    # Autograd checks the version of tensors it saved: BatchNorm saves its running statistics, so an eager
    # call of a submodule before this export (`self.encoder(x)`, then `self(x)`) failed in backward.
    versions = [buffer._version for _, buffer, _ in saved]
    changed: list[str] = []
    replaced: list[str] = []

    def written() -> list[str]:
        pairs = zip(saved, versions, strict=True)
        return _user_buffers(module, [(name, buffer) for (name, buffer, _), old in pairs if buffer._version != old])

    try:
        yield changed, replaced, written
    finally:
        current = dict(module.named_buffers())
        with torch.no_grad():
            for name, buffer, value in saved:
                if current.get(name) is not buffer:  # assigned a new tensor (self.ema = ...): put the old one back
                    owner_name, _, attribute = name.rpartition(".")
                    module.get_submodule(owner_name)._buffers[attribute] = buffer
                    replaced.append(name.removeprefix("_original_module."))
                elif not torch.equal(buffer, value):
                    changed.append(name)
                buffer.copy_(value)
        torch._C._autograd._unsafe_set_version_counter([buffer for _, buffer, _ in saved], versions)
        by_name = dict(module.named_buffers())
        changed[:] = _user_buffers(module, [(name, by_name[name]) for name in changed])


def _user_buffers(module: torch.nn.Module, buffers: list[tuple[str, torch.Tensor]]) -> list[str]:
    """The names, as the user knows them, of ``buffers`` other than the BatchNorm statistics lightning_ort
    keeps in step with eager."""
    handled, _ = _batch_norm_state(module)
    # ORT exports its _FlattenedModule, which holds the user's module as `_original_module`.
    return [name.removeprefix("_original_module.") for name, buffer in buffers if id(buffer) not in handled]


def _buffer_updates(mutated: list[str]) -> str:
    return (
        f"its forward updates buffer(s) {', '.join(mutated)} in place; an ONNX graph cannot write to "
        "buffers, so they would silently stop changing under ORT"
    )


def user_modules(module: torch.nn.Module) -> dict[int, tuple[torch.nn.Module, str]]:
    """The user's modules under ORT's flattened ``module`` (the adapter's owner included), by id, with
    the names the user knows them by."""
    modules = {
        id(submodule): (submodule, name.removeprefix("_original_module").lstrip(".") or "self")
        for name, submodule in module.named_modules()
        if submodule is not module
    }
    owner = getattr(adapter_of(module), "_owner", None)
    if isinstance(owner, torch.nn.Module):
        modules[id(owner)] = (owner, "self")
    return modules


def _reads_sizes(filename: str, lineno: int) -> bool:
    """Whether the source line reads a tensor's sizes (``.shape``, ``.size(``)."""
    line = linecache.getline(filename, lineno)
    return ".shape" in line or ".size(" in line


def adapter_of(module: torch.nn.Module) -> torch.nn.Module:
    """The module ORT's flattened ``module`` wraps (lightning_ort's ForwardAdapter)."""
    return getattr(module, "_original_module", module)


def _check_static_patterns(module: torch.nn.Module) -> None:
    """Refuse modules with sparse embeddings or updating spectral norms (forward hooks are checked before every
    call, guard.py)."""
    sparse = [name.removeprefix("_original_module.") for name in trace_checks.sparse_embeddings(module)]
    if sparse:
        raise ORTUnsupportedModelError(
            f"embedding layer(s) {', '.join(sparse)} use sparse=True; ORT computes dense gradients. Fix: "
            "sparse=False, or keep them out of ORT with ORTStrategy(modules=[...])"
        )
    spectral = [name.removeprefix("_original_module.") for name in trace_checks.updating_spectral_norms(module)]
    if spectral:
        raise ORTUnsupportedModelError(
            f"spectral_norm parametrization(s) {', '.join(spectral)} update their power-iteration vectors (_u, _v) "
            "in place at every training forward; an ONNX graph cannot write buffers, so they would stop changing "
            "under ORT. Fix: keep those layers out of ORT with ORTStrategy(modules=[...])"
        )


@contextlib.contextmanager
def _random_states_kept() -> Iterator[None]:
    """Python's, NumPy's and torch's random states as they were before the block, also when it raises.

    The trace runs ``forward``, whose dropout draws from torch's generator. ORT puts the states back after
    an export that succeeds only; after one that fails, the module's calls in PyTorch drew other numbers
    than the same run without ORT would."""
    from onnxruntime.training.ortmodule import _utils

    states = _utils.get_random_states()
    try:
        yield
    finally:
        _utils.set_random_states(states)


@contextlib.contextmanager
def guarded_export(module: torch.nn.Module) -> Iterator[None]:
    """Run ORT's export of ``module`` safely (:func:`_guarded_export`); when it fails or is refused, put the
    Python state its forward runs changed back, since PyTorch runs this step's forward again."""
    state = PythonState(user_modules(module))
    try:
        with _guarded_export(module, state):
            yield
    except Exception:
        state.restore()
        raise


@contextlib.contextmanager
def _guarded_export(module: torch.nn.Module, state: PythonState) -> Iterator[None]:
    """Run ORT's export of ``module`` safely.

    The export uses the TorchScript exporter, leaves the module's buffers as they were, and is
    rejected with :class:`ORTUnsupportedModelError` when the module applies a custom
    ``torch.autograd.Function`` that does not become a PythonOp node (with custom-Function support
    off, or through an ONNX ``symbolic``, ORT would differentiate its forward and ignore its
    backward) or takes data-dependent Python branches (the trace would freeze one branch).
    """
    _, cumulative_batch_norms = _batch_norm_state(module)
    if cumulative_batch_norms:
        raise ORTUnsupportedModelError(
            f"BatchNorm layer(s) {', '.join(cumulative_batch_norms)} use momentum=None (cumulative average), "
            "whose factor depends on num_batches_tracked and would be frozen into the ONNX graph"
        )
    _check_static_patterns(module)
    versions = trace_checks.parameter_versions(module)
    exported = _ExportRecord()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_random_states_kept())
        stack.enter_context(exporting(module))
        mutated, replaced, written_buffers = stack.enter_context(_preserved_buffers(module, exported))
        stack.enter_context(_traced_batch_norm_calls(module, exported))
        reads = python_reads.reads_of(adapter_of(module))
        stack.enter_context(python_reads.recorded_reads(reads, user_modules(module)))
        index_conversions = stack.enter_context(trace_checks.index_conversions(_user_frame))
        records = stack.enter_context(warnings.catch_warnings(record=True))
        warnings.simplefilter("always", torch.jit.TracerWarning)
        calls = stack.enter_context(traced_calls(module, _user_frame, records))
        iterations = stack.enter_context(trace_checks.varying_iterations(_user_frame))
        stack.enter_context(trace_checks.fixed_size_numbers())
        decisions = stack.enter_context(size_guards.recorded_decisions(adapter_of(module), _user_frame))
        inputs = stack.enter_context(trace_checks.input_copies())
        stack.enter_context(_torchscript_exporter(exported))
        stack.enter_context(attention_fast_path_off())
        stack.enter_context(hf_attention.exported_sdpa())
        functions = stack.enter_context(_record_autograd_functions())
        grad_regions = stack.enter_context(_record_grad_disabling(GradRegions(module, inputs, graph_inputs_of)))
        calls.grad_regions = grad_regions
        stored_tensors = stack.enter_context(_record_stored_tensors(module, state))
        draws = stack.enter_context(python_random.random_draws(_user_frame))
        checkpointed_norms = stack.enter_context(checkpointed_running_statistics(module))
        try:
            yield
        except Exception as error:
            if calls.unsupported:
                log.debug("ORT's export of a call it cannot train failed", exc_info=error)
                raise ORTUnsupportedModelError(calls.unsupported[0]) from None
            if torch.utils.checkpoint.CheckpointFunction in functions:
                # ORT's own message blames export in general; fallback reports show the root cause only.
                log.debug("ORT's export of a reentrant checkpoint failed", exc_info=error)
                raise ORTUnsupportedModelError(_REENTRANT_CHECKPOINT) from None
            written = written_buffers()
            if written:  # its update (buffer.copy_(...)) is what torch failed to export
                log.debug("ORT's export of an in-place buffer update failed", exc_info=error)
                raise ORTUnsupportedModelError(_buffer_updates(written)) from None
            raise
    for record in records:
        # The exporter's own deprecation and graph-rewrite notes are about ORT's export call, not the user's code.
        if not issubclass(record.category, torch.jit.TracerWarning) and not record.filename.startswith(_ONNX_DIR):
            warnings.warn_explicit(record.message, record.category, record.filename, record.lineno)
    python_changes = state.changed()
    if calls.unsupported:
        raise ORTUnsupportedModelError(calls.unsupported[0])
    problem = _functions_problem(functions, exported)
    if problem is not None:
        raise ORTUnsupportedModelError(problem)
    if grad_regions.switched:
        raise ORTUnsupportedModelError(
            f"its forward turns gradients off with set_grad_enabled(False) or inference_mode at "
            f"{grad_regions.switched[0]}; the export cannot tell which computations that covers, and ORT's graph "
            "would compute gradients through them. Fix: use a `with torch.no_grad():` block (ORT follows one that "
            "computes from buffers and inputs that need no gradient), or .detach() the result, which ORT respects"
        )
    if grad_regions.unsafe:
        raise ORTUnsupportedModelError(
            f"its forward turns gradients off (torch.no_grad() at "
            f"{grad_regions.unsafe[0]}) around a computation from parameters or inputs that need gradients; ORT's "
            "graph would compute gradients through that region. Fix: compute it outside forward, or use .detach() "
            "on its result, which ORT respects"
        )
    if checkpointed_norms:
        raise ORTUnsupportedModelError(
            f"normalization layer(s) {', '.join(checkpointed_norms)} update running statistics inside "
            "torch.utils.checkpoint(use_reentrant=False); eager PyTorch updates them twice per step (again when it "
            "recomputes the checkpointed function in backward), ORT's graph once. Fix: keep BatchNorm out of the "
            "checkpointed function, or keep that module out of ORT with ORTStrategy(modules=[...])"
        )
    if draws:
        raise ORTUnsupportedModelError(
            f"its forward draws a Python or NumPy random number at {draws[0]}; the export keeps the number drawn "
            "then, so every later step would take the same branch or value. Fix: draw with torch inside the "
            "computation (torch.rand(()) < p as a tensor mask, nn.Dropout), pass the number to forward as a tensor, "
            "or keep that module out of ORT with ORTStrategy(modules=[...])"
        )
    if stored_tensors:
        raise ORTUnsupportedModelError(
            f"its forward stores tensor(s) {', '.join(stored_tensors)} on the module; ORT computes them inside its "
            "graph and would never assign them again, so code reading them after forward would see the export's. "
            "Fix: return them from forward"
        )
    if python_changes:
        raise ORTUnsupportedModelError(
            f"its forward changes Python attribute(s) {', '.join(python_changes)}; ORT runs the traced graph "
            "and would never run that code again"
        )
    if mutated:
        raise ORTUnsupportedModelError(_buffer_updates(mutated))
    if replaced:
        raise ORTUnsupportedModelError(
            f"its forward assigns new tensors to buffer(s) {', '.join(replaced)} (self.buffer = ...); an ONNX graph "
            "cannot write to buffers, so they would silently stop changing under ORT"
        )
    in_place = [name.removeprefix("_original_module.") for name in trace_checks.changed_in_place(module, versions)]
    if in_place:
        raise ORTUnsupportedModelError(
            f"its forward changes parameter(s) {', '.join(in_place)} in place (nn.Embedding(max_norm=...) does); "
            "ORT's graph computes with the change but never writes it back to the parameter"
        )
    if trace_checks.changed_inputs(inputs):
        raise ORTUnsupportedModelError(
            "its forward changes an input tensor in place (x.mul_(2), x[:, 0] = 0, x.relu_()); ORT's graph works "
            "on its own copy, so the caller's tensor would not change as it does in eager. Fix: use out-of-place "
            "operations (x = x * 2), or clone the input first (x = x.clone())"
        )
    if index_conversions:
        raise ORTUnsupportedModelError(
            "its forward turns a tensor (under ONNX export, also a size such as x.shape[1]) into a Python integer "
            f"at {index_conversions[0]} (range(), an index); the export freezes that number, so a loop over a "
            "dimension would stay unrolled for the first batch's size. Fix: use tensor operations over the whole "
            "dimension, or keep that module out of ORT with ORTStrategy(modules=[...])"
        )
    if calls.size_tensors:
        raise ORTUnsupportedModelError(
            f"its forward gives a tensor (under ONNX export, also a size such as x.shape[2]) as a kernel or output "
            f"size at {calls.size_tensors[0]} (F.max_pool1d(x, x.shape[2])); the export freezes that number, so later "
            "batches of another length would pool over the first batch's size. Fix: reduce over the dimension "
            "(x.amax(dim=2), x.mean(dim=2)) or use a fixed size, or keep that module out of ORT with "
            "ORTStrategy(modules=[...])"
        )
    if iterations:
        raise ORTUnsupportedModelError(
            f"its forward iterates over a tensor at {iterations[0]} (q, k, v = qkv, for row in x) whose first "
            "dimension can change size between batches (the batch or sequence dimension); the export keeps one "
            "part per element of the first batch. Fix: iterate over a dimension of constant size (one a reshape "
            "or view sets with a number, as in qkv.reshape(B, T, 3, H, D).permute(2, 0, 3, 1, 4)), or use "
            "tensor operations over the whole dimension"
        )
    if calls.counted_splits:
        raise ORTUnsupportedModelError(
            f"its forward splits a tensor at {calls.counted_splits[0]} (len(x.unbind(1)), enumerate(x.split(1, 1))) "
            "along a dimension that can change size between batches and uses only the number of parts; the export "
            "freezes that number at the first batch's size. Fix: use the size itself in tensor arithmetic "
            "(h.sum(1) / h.shape[1], h.mean(1)), or keep that module out of ORT with ORTStrategy(modules=[...])"
        )
    unsafe = [record for record in records if _is_unsafe_tracer_warning(record)]
    if any(record.filename == _ORT_OUTPUT_FLATTENING for record in unsafe):
        raise ORTUnsupportedModelError(_NUMBER_OUTPUT)
    if not unsafe:
        size_guards.keep_decisions(adapter_of(module), decisions, exported.traced)
    if unsafe:
        first = unsafe[0]
        text = str(first.message)
        if "boolean" in text and _reads_sizes(first.filename, first.lineno):  # the hint in place of torch's text
            line = linecache.getline(first.filename, first.lineno).strip()
            raise ORTUnsupportedModelError(
                _BRANCH_ON_SIZES.format(location=f"{first.filename}:{first.lineno}", line=line or "source not found")
            )
        sizes = _SIZES_ARE_TENSORS if "Converting a tensor to a Python" in text and "boolean" not in text else ""
        raise ORTUnsupportedModelError(
            "its forward has Python control flow or values that depend on tensor data, which the ONNX "
            f"export would freeze ({first.filename}:{first.lineno}: {first.message}){sizes}"
        )
