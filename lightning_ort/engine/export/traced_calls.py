"""The torch calls of the traced forward whose arguments or results the export freezes silently.

A :class:`TracedCalls` mode sees every torch call with its arguments as given, however the function
was reached: also one bound before the export (``from torch.nn.functional import avg_pool1d``,
``pool = torch.max_pool1d``) or called as ``torch._C._nn.avg_pool2d``. It records two patterns that
trained silently differently from eager PyTorch:

- a tensor given alone for a pooling size (``F.max_pool1d(h, h.shape[2])``): torch's argument parser
  turns a tensor given for an ``int[N]`` into a number with ``item()``, which neither ``__index__``
  nor a TracerWarning reveals, so the kernel or output size stayed the first batch's;
- a tensor computed from the graph's inputs given where torch reads a Python number (``F.pad(h, p,
  value=v)``, ``h.roll(shift)``, ``F.layer_norm(h, s, eps=eps)``, ``F.cross_entropy(..., label_smoothing=t)``,
  ``h[:, [i]]``), or turned into a NumPy array (``np.exp(t)``): a Python number argument of ``forward`` is
  such a tensor while ORT exports. torch's argument parser reads it with ``item()`` and the trace keeps
  the number, so later calls computed with the first call's value. Seen as a result that does not depend
  on the tensor in the trace;
- ``torch.tensor_split(x, n)`` with ``n`` computed from the inputs (``x.shape[1] // 5 + 2``): the
  trace keeps the first call's number of parts, so ``parts[-1]`` or a loop over the parts used the
  wrong parts (torch takes ``n`` as a tensor there, so the rule above does not see it);
- a split along a dimension whose size can change (``len(x.unbind(1))``, ``for i, _ in
  enumerate(x.split(1, dim=1))``) whose parts are never used: only the Python count of the parts
  matters, the trace keeps it as a constant, and the split itself leaves the graph. When a part is
  used, ORT's ``Split`` fails loudly on a batch of another size instead.

``torch.tensor`` (and ``as_tensor``, ``asarray``, ``Tensor.new_tensor``) of Python numbers is a constant
on every call, so torch's TracerWarning for it is dropped (``torch.tensor(0.5)``, class weights from a
list; a number read from the module is watched by ``python_reads``); built from a list holding tensors
(``torch.tensor([x.shape[0], 1])``), it is refused with the fix.

In-place changes of views go through :mod:`view_writes`: written back into the viewed tensor when
indexing made the view, refused otherwise (torch's export drops them).

It also names calls ORT cannot train, whose own errors said nothing a user could act on: packed
sequences for a recurrent layer, an EmbeddingBag given ``per_sample_weights``; and gradient hooks
on the forward's tensors (``h.register_hook(...)``, ``retain_grad()``), which left nothing in the
graph and silently never ran, and reads of ``Tensor.requires_grad`` in the user's code: the export
runs with gradients off, so a branch on it (``if h.requires_grad: h.register_hook(...)``) took the
no-gradient path for good.

Over 300 lines because one torch function mode (:class:`TracedCalls`) sees every call once and applies
all these patterns to it; their argument tables and helpers are what the mode reads.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils import _pytree

from lightning_ort.engine.export.fixed_sizes import fixed_number, fixed_size
from lightning_ort.engine.export.grad_regions import GradRegions
from lightning_ort.engine.export.value_traces import value_trace
from lightning_ort.engine.export.view_writes import VIEW_CHANGE, ViewWrites, changes_a_view
from lightning_ort.engine.ops.symbolics import bilinear, tensor_splits

_POOLING = frozenset(
    f"{kind}_pool{dims}d" for kind in ("max", "avg", "lp", "adaptive_max", "adaptive_avg") for dims in (1, 2, 3)
)
# lp_pool has no ATen operator (it is avg_pool of a power): its sizes are ``kernel_size`` and ``stride``.
_LP_POOL_SIZES = (frozenset({2, 3}), frozenset({"kernel_size", "stride"}))
# Splits whose number of parts follows the size of the dimension split: the position of their ``dim``.
_COUNTED_SPLITS = {"unbind": 1, "split": 2, "unsafe_split": 2, "chunk": 2, "unsafe_chunk": 2}
_TO_NUMPY = frozenset({"__array__", "numpy"})
_NUMBER_READ = (
    "; the trace keeps the first call's number, so every later call would compute with it (a Python number "
    "argument of forward is a tensor while ORT exports, so is a buffer). Fix: pass a number that does not change "
    "as a constant (set it in __init__), compute with tensor operations, or keep that module out of ORT with "
    "ORTStrategy(modules=[...])"
)
# Functions that copy a data argument (at this position) into a new tensor, which the trace keeps as a constant
_FROM_DATA = {"tensor": 0, "as_tensor": 0, "asarray": 0, "new_tensor": 1}
_CONSTANT_DATA = "results are registered as constants in the trace"
_PYTHON_NUMBERS = (bool, int, float, complex)
_GRADIENT_HOOKS = frozenset({"register_hook", "retain_grad", "register_post_accumulate_grad_hook"})
_REQUIRES_GRAD = torch._C.TensorBase.__dict__["requires_grad"]
_TORCH_DIR = os.path.dirname(torch.__file__)
_ORT_SPEC = importlib.util.find_spec("onnxruntime")
# ORT's package directory (the export guard skips its frames too); torch's when ORT is missing
ORT_DIR = os.path.dirname(_ORT_SPEC.origin) + os.sep if _ORT_SPEC and _ORT_SPEC.origin else _TORCH_DIR
_REQUIRES_GRAD_READ = (
    "; ORT exports the forward with gradients off, so every tensor reads False there and the graph keeps the "
    "branch for no gradients. Fix: decide with a flag the module keeps (self.training), or keep that module "
    "out of ORT with ORTStrategy(modules=[...])"
)


@functools.cache
def _size_positions(name: str) -> tuple[frozenset[int], frozenset[str]]:
    """Positions and names of ``name``'s ``int[N]`` parameters (``F.max_pool1d`` and the other Python
    wrappers take the ATen operator's arguments in the same order)."""
    if name.startswith("lp_pool"):
        return _LP_POOL_SIZES
    positions: set[int] = set()
    names: set[str] = set()
    for schema in torch._C._jit_get_schemas_for_operator(f"aten::{name}"):
        for position, argument in enumerate(schema.arguments):
            if argument.N is not None and "List[int]" in str(argument.type):
                names.add(argument.name)
                if not argument.kwarg_only:
                    positions.add(position)
    return frozenset(positions), frozenset(names)


def _is_scalar_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 0


def _pooling_sizes(func: Any) -> tuple[frozenset[int], frozenset[str]] | None:
    """Positions and names of the size parameters of ``func`` if it is a pooling function, reached by any
    route: ``F.max_pool1d`` dispatches as ``_max_pool1d`` or ``max_pool1d_with_indices``, ``F.avg_pool2d`` is
    ``torch._C._nn.avg_pool2d``."""
    name = getattr(func, "__name__", None)
    if not isinstance(name, str) or "pool" not in name:
        return None
    name = name.removeprefix("_").removesuffix("_with_indices")
    return _size_positions(name) if name in _POOLING else None


def _gives_size_tensor(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``func`` is a pooling function given a tensor alone for one of its sizes."""
    sizes = _pooling_sizes(func)
    if sizes is None:
        return False
    positions, names = sizes
    return any(_is_scalar_tensor(args[i]) for i in positions if i < len(args)) or any(
        _is_scalar_tensor(kwargs.get(name)) for name in names
    )


def _splits_varying_dimension(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``func`` splits a traced tensor into as many parts as a dimension :func:`fixed_size` cannot
    show constant allows (``unbind``, ``split`` by a size, ``chunk``)."""
    position = _COUNTED_SPLITS.get(getattr(func, "__name__", None))  # type: ignore[arg-type]
    if position is None or not args or not isinstance(args[0], torch.Tensor) or args[0].dim() == 0:
        return False
    if position == 2 and isinstance(args[1] if len(args) > 1 else kwargs.get("split_size"), (list, tuple)):
        return False  # split([2, 3]): the sizes given fix the count
    dim = args[position] if len(args) > position else kwargs.get("dim", 0)
    if not isinstance(dim, int):
        return False
    value = value_trace(args[0])
    return value is not None and not fixed_size(value, dim)


# Nodes that read only a tensor's shape: nothing flows back through them in backward.
_SHAPE_READS = frozenset({"aten::size", "aten::sizes", "aten::numel", "aten::dim", "prim::shape"})


def _ancestors(values: list[torch._C.Value], through_sizes: bool = True) -> Iterator[torch._C.Value]:
    """``values`` and every value the open trace computes them from, each once (without the tensors whose
    sizes alone it reads, unless ``through_sizes``)."""
    pending, seen = list(values), {value.unique() for value in values}
    while pending:
        value = pending.pop()
        yield value
        if not through_sizes and value.node().kind() in _SHAPE_READS:
            continue
        for operand in value.node().inputs():
            if operand.unique() not in seen:
                seen.add(operand.unique())
                pending.append(operand)


def graph_inputs_of(value: torch._C.Value, through_sizes: bool = True) -> Iterator[torch._C.Value]:
    """The graph's inputs (the batch, parameters, buffers) the open trace computes ``value`` from; without
    ``through_sizes``, only those a gradient of ``value`` could reach (not those whose sizes alone it reads)."""
    return (ancestor for ancestor in _ancestors([value], through_sizes) if ancestor.node().kind() == "prim::Param")


def computed_from_inputs(value: torch._C.Value) -> bool:
    """Whether the open trace computes ``value`` from the graph's inputs (the batch, parameters, buffers),
    not from constants alone."""
    return next(graph_inputs_of(value), None) is not None


def _scalar_tensors(item: Any, found: list[torch.Tensor], depth: int = 0) -> None:
    """The 0-d tensors in ``item``, also inside lists, tuples, dicts and slices (``h[:, [i]]``)."""
    if isinstance(item, torch.Tensor):
        if item.dim() == 0:
            found.append(item)
    elif depth < 4 and isinstance(item, (list, tuple)):
        for element in item:
            _scalar_tensors(element, found, depth + 1)
    elif depth < 4 and isinstance(item, dict):
        for element in item.values():
            _scalar_tensors(element, found, depth + 1)
    elif depth < 4 and isinstance(item, slice):
        for element in (item.start, item.stop, item.step):
            _scalar_tensors(element, found, depth + 1)


def _varying_numbers(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[torch._C.Value, int]]:
    """The trace values of the 0-d tensors ``func`` is given besides its first argument (the tensor a
    method is called on, or a function's main operand) that the graph computes from its inputs and that
    are not sizes of fixed dimensions, with their count of uses so far: torch may read them as Python
    numbers. For a conversion to NumPy, the tensor converted."""
    found: list[torch.Tensor] = []
    if getattr(func, "__name__", None) in _TO_NUMPY:
        found.extend(args[:1])
    else:
        for argument in (*args[1:], *kwargs.values()):
            _scalar_tensors(argument, found)
    values = []
    for tensor in found:
        value = value_trace(tensor)
        if value is not None and not fixed_number(value) and computed_from_inputs(value):
            values.append((value, len(value.uses())))
    return values


def _read_as_numbers(func: Any, result: Any, values: list[tuple[torch._C.Value, int]]) -> bool:
    """Whether the call that returned ``result`` read some of ``values`` (each with its count of uses before
    the call) as a Python number: its tensor result is not computed from them in the trace, or, for an
    in-place call (``h.fill_(v)``, ``h[:, 0] = v``, whose trace value stays the view's), no node of the
    call uses them."""
    name = getattr(func, "__name__", "")
    tensors = [leaf for leaf in _pytree.tree_leaves(result) if isinstance(leaf, torch.Tensor)]
    if name == "__setitem__" or (name.endswith("_") and not name.endswith("__")) or not tensors:
        return any(len(value.uses()) <= uses for value, uses in values)
    pending = [value for value in map(value_trace, tensors) if value is not None]
    if not pending:
        return False
    wanted = {value.unique() for value, _ in values}
    for ancestor in _ancestors(pending):
        wanted.discard(ancestor.unique())
        if not wanted:
            return False
    return True


def _data_kind(data: Any, depth: int = 0) -> str | None:
    """``"numbers"`` for Python numbers, also in nested lists and tuples, and for 0-d tensors the trace computes
    from constants and fixed sizes only (``torch.tensor(q.size(-1))`` with ``q``'s last dimension the head size
    a view sets): the same on every call; ``"tensors"`` for lists or tuples holding another tensor; ``None`` for
    anything else (another tensor alone, a NumPy array)."""
    if isinstance(data, _PYTHON_NUMBERS) or _fixed_scalar(data):
        return "numbers"
    if depth and isinstance(data, torch.Tensor):
        return "tensors"
    if depth >= 4 or not isinstance(data, (list, tuple)):
        return None
    kinds = {_data_kind(element, depth + 1) for element in data}
    if "tensors" in kinds:
        return "tensors"
    return "numbers" if kinds <= {"numbers"} else None


def _fixed_scalar(data: Any) -> bool:
    """Whether ``data`` is a 0-d tensor the open trace computes from constants and fixed sizes only."""
    if not isinstance(data, torch.Tensor) or data.dim() != 0:
        return False
    value = value_trace(data)
    return value is not None and fixed_number(value)


def _copied_data(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The :func:`_data_kind` of what ``torch.tensor`` and its kin copy into a tensor; ``None`` for other calls."""
    position = _FROM_DATA.get(getattr(func, "__name__", None))  # type: ignore[arg-type]
    if position is None:
        return None
    return _data_kind(args[position] if len(args) > position else kwargs.get("data", kwargs.get("obj")))


def _unsupported(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, str] | None:
    """What the call does and why ORT cannot train it, with the fix, for the calls it cannot."""
    name = getattr(func, "__name__", None)
    if name == "tensor_split":
        sections = args[1] if len(args) > 1 else kwargs.get("sections", kwargs.get("tensor_indices_or_sections"))
        if (
            isinstance(sections, torch.Tensor)
            and sections.dim() == 0
            and _varying_numbers(func, args[:1] + (sections,), {})
        ):
            return "splits a tensor into a number of parts computed from its inputs", (
                " (tensor_split(x, n) with n from a size or an argument); the trace keeps the first call's number "
                "of parts, so later calls would index or loop over the wrong parts. Fix: split into a fixed number "
                "of parts, or use masks over the whole dimension, or keep that module out of ORT with "
                "ORTStrategy(modules=[...])"
            )
    if _copied_data(func, args, kwargs) == "tensors":
        return f"builds a tensor with {name} from a list holding tensors", (
            "; the trace copies their values into a constant, so every later call would use the first call's. "
            "Fix: combine tensors with torch.stack or torch.cat, or keep that module out of ORT with "
            "ORTStrategy(modules=[...])"
        )
    if name == "_pack_padded_sequence":
        return "packs sequences for a recurrent layer", (
            " (pack_padded_sequence); ORT cannot train recurrent layers over packed sequences. Fix: give the layer the "
            "padded batch (a bidirectional layer then reads padding at the end of shorter sequences, unlike with "
            "packing), or keep the recurrent module out of ORT with ORTStrategy(modules=[...])"
        )
    if name in _GRADIENT_HOOKS:
        return "registers a gradient hook on a tensor", (
            f" ({name}); ORT computes the gradients of its graph in one piece and calls no Python hook inside it, "
            "so the hook would never see or change them. Fix: register the hook on a tensor forward returns "
            "and that nothing inside forward uses, or keep that module out of ORT with ORTStrategy(modules=[...])"
        )
    if name == "embedding_bag":
        position = 8 if func is torch.nn.functional.embedding_bag else 6
        weights = args[position] if len(args) > position else kwargs.get("per_sample_weights")
        if weights is not None:
            return "gives an embedding bag per_sample_weights", (
                "; ORT's export of EmbeddingBag has no per-sample weights. Fix: multiply the looked-up rows "
                "(F.embedding) by the weights and sum them per bag, or keep that module out of ORT with "
                "ORTStrategy(modules=[...])"
            )
    return None


class TracedCalls(torch.overrides.TorchFunctionMode):
    """Records, while the export traces, where (``locate()`` of the caller) code gave a pooling function a
    tensor for a size (:attr:`size_tensors`), split a varying dimension only to count the parts
    (:attr:`counted_splits`, complete once :meth:`check_split_uses` ran as the traced module's forward hook)
    and called what ORT cannot train (:attr:`unsupported`: why, for the error).

    ``records`` are the warnings recorded meanwhile (``warnings.catch_warnings(record=True)``); those raised by
    torch's C functions keep naming the code that called them."""

    def __init__(self, locate: Callable[[], str | None], records: list[warnings.WarningMessage]) -> None:
        super().__init__()
        self.locate, self.records = locate, records
        self.size_tensors: list[str] = []
        self.counted_splits: list[str] = []
        self.unsupported: list[str] = []
        self._splits: list[tuple[str, tuple[torch.Tensor, ...]]] = []
        self.views = ViewWrites()
        self.grad_regions: GradRegions | None = None  # set by the export guard

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        tracing = torch.jit.is_tracing()
        if tracing:
            func, args, kwargs = tensor_splits.traced_form(func, args, kwargs)
            func, args, kwargs = bilinear.traced_form(func, args, kwargs)
        sized = tracing and _gives_size_tensor(func, args, kwargs)
        if sized:
            _note(self.size_tensors, self.locate())
        problem = _unsupported(func, args, kwargs) if tracing else None
        if problem is not None:
            _note(self.unsupported, f"its forward {problem[0]} at {self.locate() or 'torch'}{problem[1]}")
        if tracing and getattr(func, "__self__", None) is _REQUIRES_GRAD:
            # read by the user's code itself: torch's own checks (checkpoint, attention's fast path) are not branches
            location = None if _from_library(sys._getframe(1)) else self.locate()
            if location is not None:
                _note(self.unsupported, f"its forward reads Tensor.requires_grad at {location}{_REQUIRES_GRAD_READ}")
        split = tracing and _splits_varying_dimension(func, args, kwargs)
        numbers = _varying_numbers(func, args, kwargs) if tracing and not sized else []  # pooling: its own reason
        recorded = len(self.records)
        view_change = tracing and changes_a_view(func, args, kwargs) and self.views.of_held_tensor(args[0])
        if view_change and self.views.writable(args[0]):
            result = self.views.change(func, args, kwargs)
        else:
            if view_change and not _from_library(sys._getframe(1)):
                _note(self.unsupported, f"its forward changes a view in place at {self.locate()}{VIEW_CHANGE}")
            result = func(*args, **kwargs)
        if tracing:
            self.views.record(func, args, result)
        # a call that gives no tensor (x.device, x.dtype, x.size()) computes nothing a gradient could flow through
        if tracing and self.grad_regions is not None and _has_tensor(result):
            self.grad_regions.check(args, kwargs)
        if tracing and _copied_data(func, args, kwargs) == "numbers" and not _from_ort(sys._getframe(1)):
            # a tensor of Python numbers is the same on every call; a number read from the module is watched
            # by python_reads, one converted from a tensor has its own TracerWarning
            self.records[recorded:] = [r for r in self.records[recorded:] if _CONSTANT_DATA not in str(r.message)]
        name = getattr(func, "__name__", "a torch function")
        to_numpy = name in _TO_NUMPY
        if numbers and (to_numpy or _read_as_numbers(func, result, numbers)):
            location = self.locate()
            if location is not None:
                what = (
                    "converts a tensor computed from its inputs to a NumPy array"
                    if to_numpy
                    else (f"gives {name} a tensor computed from its inputs where torch reads a Python number")
                )
                _note(self.unsupported, f"its forward {what} at {location}{_NUMBER_READ}")
        if len(self.records) > recorded:
            _attribute_to_caller(self.records[recorded:], sys._getframe(1))
        location = self.locate() if split else None
        if location is not None:  # None inside torch's own code
            self._splits.append((location, tuple(result)))
        return result

    def check_split_uses(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        """Forward hook of the traced module: the splits of this forward none of whose parts the graph uses or
        the module returns. It runs while the trace is open, before its dead code is removed."""
        if not torch.jit.is_tracing():
            return
        returned = {id(leaf) for leaf in _pytree.tree_leaves(output) if isinstance(leaf, torch.Tensor)}
        for location, parts in self._splits:
            if not any(id(part) in returned or _has_uses(part) for part in parts):
                _note(self.counted_splits, location)
        self._splits.clear()


def _has_tensor(result: Any) -> bool:
    return any(isinstance(leaf, torch.Tensor) for leaf in _pytree.tree_leaves(result))


def _from_ort(caller: types.FrameType) -> bool:
    """Whether ORT's code made the call: it turns numbers among forward's outputs into tensors, and the export
    guard refuses those by the TracerWarning ``torch.tensor`` gives there."""
    return caller.f_code.co_filename.startswith(ORT_DIR)


def _from_library(caller: types.FrameType) -> bool:
    """Whether torch's own Python code made the call (its checks and in-place work are not the user's)."""
    return caller.f_code.co_filename.startswith(_TORCH_DIR)


def _has_uses(tensor: torch.Tensor) -> bool:
    value = value_trace(tensor)
    return value is None or bool(value.uses())  # not part of the trace: nothing to tell, so nothing to refuse


def _note(seen: list[str], location: str | None) -> None:
    if location is not None and location not in seen:
        seen.append(location)


def _attribute_to_caller(records: list[warnings.WarningMessage], caller: types.FrameType) -> None:
    """Give ``caller`` (the code that called the torch function) the warnings the function's C code raised:
    they name the innermost Python frame, the mode's, where the export's checks need the caller's file (torch's
    own input validation is exempt) and line."""
    for record in records:
        if record.filename == TracedCalls.__torch_function__.__code__.co_filename:
            record.filename, record.lineno = caller.f_code.co_filename, caller.f_lineno


@contextlib.contextmanager
def traced_calls(
    module: torch.nn.Module, locate: Callable[[], str | None], records: list[warnings.WarningMessage]
) -> Iterator[TracedCalls]:
    """Within the block, a :class:`TracedCalls` watches the calls of ``module``'s traced forward."""
    calls = TracedCalls(locate, records)
    handle = module.register_forward_hook(calls.check_split_uses)
    try:
        with calls:
            yield calls
    finally:
        handle.remove()
