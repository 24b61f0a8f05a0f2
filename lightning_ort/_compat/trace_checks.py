"""Module patterns a traced ONNX graph cannot reproduce, found around ORT's export.

Each one trained silently differently from eager PyTorch before it was checked:

- a tensor turned into a Python integer by ``__index__`` (``for t in range(x.shape[1])``, a list
  index): under the tracer a size is a tensor, and ``range()`` reads it without the warning
  ``int()`` gives, so a loop over the sequence length stayed unrolled for the first batch's length;
- a parameter changed in place by ``forward`` (``nn.Embedding(max_norm=...)`` renormalises the rows
  it looks up): the graph computes with the change but never writes it back;
- Python forward hooks and pre-hooks on submodules: they run during the export only, so features
  captured by a hook were stale (weight normalisation and pruning hooks, which compute a weight
  from parameters, become part of the graph and are fine);
- embeddings with ``sparse=True``: ORT computes dense gradients;
- an input changed in place by ``forward`` (``x.mul_(2)``, ``x[:, 0] = 0``): ORT's graph works on
  its own copy, so the caller's tensor stayed unchanged where eager changes it;
- a tensor given alone for a fixed-size list of ints (``F.max_pool1d(h, h.shape[2])``,
  ``F.adaptive_avg_pool1d(h, h.shape[2] // 2)``): torch's argument parser reads it with ``item()``,
  neither through ``__index__`` nor with a TracerWarning, so the kernel or output size stayed the
  first batch's (a TextCNN's max over time covered part of a longer sequence);
- iteration over a tensor's dimension whose size can change (``for row in x``): the trace holds one
  part per element of the first batch, and where no part reaches the graph (``sum(1 for _ in x)``)
  the frozen count went unnoticed. Iterating over a constant size (``q, k, v = qkv``) is allowed.
"""

from __future__ import annotations

import contextlib
import dis
import functools
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.nn.utils import prune
from torch.nn.utils.weight_norm import WeightNorm

_SUBSCRIPTS = {"BINARY_SUBSCR", "STORE_SUBSCR", "BINARY_SLICE", "STORE_SLICE"}
# Hooks that compute a weight from parameters before each forward: the trace records the computation.
_TRACEABLE_HOOKS = (WeightNorm, prune.BasePruningMethod)


@contextlib.contextmanager
def index_conversions(locate: Callable[[], str | None]) -> Iterator[list[str]]:
    """Where (``locate()`` of the caller, e.g. ``file:line``) traced code called ``Tensor.__index__``."""
    seen: list[str] = []
    original = torch.Tensor.__index__

    def __index__(self: torch.Tensor) -> int:
        if torch.jit.is_tracing() and not _in_subscript(sys._getframe(1)):
            location = locate()
            if location is not None and location not in seen:
                seen.append(location)
        return original(self)

    torch.Tensor.__index__ = __index__  # type: ignore[method-assign,assignment]
    try:
        yield seen
    finally:
        torch.Tensor.__index__ = original  # type: ignore[method-assign]


# Functions taking kernel, stride or output sizes as int[N], where a size read from the input (the
# length of a sequence) is the natural argument.
_POOLING = frozenset(
    f"{kind}_pool{dims}d" for kind in ("max", "avg", "lp", "adaptive_max", "adaptive_avg") for dims in (1, 2, 3)
)
# lp_pool has no ATen operator (it is avg_pool of a power): its sizes are ``kernel_size`` and ``stride``.
_LP_POOL_SIZES = (frozenset({2, 3}), frozenset({"kernel_size", "stride"}))


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


class _SizeListReads(torch.overrides.TorchFunctionMode):
    """Records pooling calls given a tensor for a size. A mode sees every torch call with its arguments as
    given, however the function was reached: also one bound before the export (``from torch.nn.functional
    import avg_pool1d``, ``pool = torch.max_pool1d``) or called as ``torch._C._nn.avg_pool2d``, which
    replacing ``F``'s and ``torch``'s attributes during the export missed."""

    def __init__(
        self, locate: Callable[[], str | None], seen: list[str], records: list[warnings.WarningMessage]
    ) -> None:
        super().__init__()
        self.locate, self.seen, self.records = locate, seen, records

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        sizes = _pooling_sizes(func)
        if sizes is not None and torch.jit.is_tracing():
            positions, names = sizes
            if any(_is_scalar_tensor(args[i]) for i in positions if i < len(args)) or any(
                _is_scalar_tensor(kwargs.get(name)) for name in names
            ):
                location = self.locate()
                if location is not None and location not in self.seen:
                    self.seen.append(location)
        recorded = len(self.records)
        result = func(*args, **kwargs)
        if len(self.records) > recorded:
            _attribute_to_caller(self.records[recorded:], sys._getframe(1))
        return result


def _attribute_to_caller(records: list[warnings.WarningMessage], caller: types.FrameType) -> None:
    """Give ``caller`` (the code that called the torch function) the warnings the function's C code raised:
    they name the innermost Python frame, the mode's, where the export's checks need the caller's file (torch's
    own input validation is exempt) and line."""
    for record in records:
        if record.filename == _SizeListReads.__torch_function__.__code__.co_filename:
            record.filename, record.lineno = caller.f_code.co_filename, caller.f_lineno


@contextlib.contextmanager
def size_list_reads(locate: Callable[[], str | None], records: list[warnings.WarningMessage]) -> Iterator[list[str]]:
    """Where (``locate()`` of the caller) traced code gave a tensor alone for a pooling size
    (``F.max_pool1d(h, h.shape[2])``): torch's argument parser turns a tensor given for an ``int[N]`` into a
    number with ``item()``, which neither ``__index__`` nor a TracerWarning reveals, so the export freezes it.

    ``records`` are the warnings recorded meanwhile (``warnings.catch_warnings(record=True)``); those raised by
    torch's C functions keep naming the code that called them."""
    seen: list[str] = []
    with _SizeListReads(locate, seen, records):
        yield seen


# Operators whose output has the shape of their first input.
_SAME_SHAPE = frozenset(
    f"aten::{name}"
    for name in (
        "contiguous", "clone", "detach", "to", "type_as", "dropout", "relu", "gelu", "silu", "tanh", "sigmoid",
        "softmax", "log_softmax", "layer_norm",
    )
)  # fmt: skip
_MAX_DEPTH = 64


def _constant_int(value: torch._C.Value) -> int | None:
    node = value.node()
    if node.kind() != "prim::Constant":
        return None
    constant = value.toIValue()
    return constant if isinstance(constant, int) and not isinstance(constant, bool) else None


def _constant_ints(value: torch._C.Value) -> list[int] | None:
    """A trace's list of ints, when every element is a constant."""
    node = value.node()
    if node.kind() == "prim::ListConstruct":
        elements = [_constant_int(element) for element in node.inputs()]
        return None if any(element is None for element in elements) else elements  # type: ignore[return-value]
    constant = value.toIValue() if node.kind() == "prim::Constant" else None
    return list(constant) if isinstance(constant, (list, tuple)) else None


def _fixed_size(value: torch._C.Value, dim: int, depth: int = 0) -> bool:
    """Whether dimension ``dim`` of the traced ``value`` has a size no input's size can change: a
    constant (or arithmetic of constants and fixed sizes, ``C // n_head``) in a ``reshape``/``view``,
    moved by ``permute``/``transpose``, the count of a ``stack``, a ``Linear`` layer's features, an
    embedding's width, kept by element-wise ops and broadcasts. Anything this does not follow counts
    as varying."""
    rank = value.type().dim() if isinstance(value.type(), torch._C.TensorType) else None
    if rank is None or depth > _MAX_DEPTH or not -rank <= dim < rank:
        return False
    dim %= rank
    node = value.node()
    kind = node.kind()
    inputs = list(node.inputs())
    if kind == "prim::Constant":  # a tensor the trace holds as a value
        return True
    if kind in _SAME_SHAPE:
        return _fixed_size(inputs[0], dim, depth + 1)
    if kind in ("aten::reshape", "aten::view"):
        sizes = list(inputs[1].node().inputs()) if inputs[1].node().kind() == "prim::ListConstruct" else None
        if sizes is None:
            constants = _constant_ints(inputs[1])
            return constants is not None and constants[dim] >= 0
        size = _constant_int(sizes[dim])
        return size >= 0 if size is not None else _fixed_number(sizes[dim], depth + 1)
    if kind == "aten::embedding":  # (weight, indices, ...): the last dimension is the weight's width
        return dim == rank - 1 or _fixed_size(inputs[1], dim, depth + 1)
    if kind in _BROADCASTING:
        return _fixed_broadcast(value, [tensor for tensor in inputs if isinstance(tensor.type(), torch._C.TensorType)],
                                dim, depth)  # fmt: skip
    if kind == "aten::permute":
        order = _constant_ints(inputs[1])
        return order is not None and _fixed_size(inputs[0], order[dim], depth + 1)
    if kind == "aten::transpose":
        first, second = _constant_int(inputs[1]), _constant_int(inputs[2])
        if first is None or second is None:
            return False
        swap = {first % rank: second % rank, second % rank: first % rank}
        return _fixed_size(inputs[0], swap.get(dim, dim), depth + 1)
    if kind == "aten::unsqueeze":
        position = _constant_int(inputs[1])
        if position is None:
            return False
        position %= rank
        return dim == position or _fixed_size(inputs[0], dim - (dim > position), depth + 1)
    if kind == "aten::stack":
        position = _constant_int(inputs[1])
        return position is not None and dim == position % rank and inputs[0].node().kind() == "prim::ListConstruct"
    if kind == "aten::linear":
        return dim == rank - 1 or _fixed_size(inputs[0], dim, depth + 1)
    return False


# Element-wise operators whose output broadcasts their tensor inputs.
_BROADCASTING = frozenset(f"aten::{name}" for name in ("add", "sub", "mul", "div", "where", "masked_fill"))
# Integer arithmetic of sizes (``C // n_head``) and the wrappers the trace puts around numbers.
_NUMBER_OPS = frozenset(
    f"{namespace}::{name}"
    for namespace, names in (
        (
            "aten",
            ("floordiv", "floor_divide", "mul", "add", "sub", "div", "remainder", "Int", "ScalarImplicit", "Float"),
        ),
        ("prim", ("NumToTensor",)),
    )
    for name in names
)


def _fixed_number(value: torch._C.Value, depth: int) -> bool:
    """Whether a traced number (an int or a 0-d tensor) is computed from constants and fixed sizes only."""
    if depth > _MAX_DEPTH:
        return False
    node = value.node()
    if node.kind() == "prim::Constant":
        return True
    if node.kind() == "aten::size":
        return _is_fixed_size_node(node, depth)
    return node.kind() in _NUMBER_OPS and all(_fixed_number(operand, depth + 1) for operand in node.inputs())


def _is_fixed_size_node(node: torch._C.Node, depth: int = 0) -> bool:
    """Whether the trace's ``aten::size(x, d)`` node reads a dimension :func:`_fixed_size` shows constant."""
    source, index = list(node.inputs())
    dim = _constant_int(index)
    return dim is not None and _fixed_size(source, dim, depth + 1)


def _fixed_broadcast(value: torch._C.Value, tensors: list[torch._C.Value], dim: int, depth: int) -> bool:
    """A broadcast's dimension is fixed when one operand's is fixed at a size other than 1 (the others
    must then match it or be 1) or every operand's is fixed."""
    rank = value.type().dim()
    aligned = []
    for tensor in tensors:
        tensor_rank = tensor.type().dim()
        index = dim - (rank - tensor_rank) if tensor_rank is not None else -1
        if tensor_rank is None or index < 0:
            continue
        sizes = tensor.type().sizes()
        aligned.append((_fixed_size(tensor, index, depth + 1), sizes[index] if sizes is not None else None))
    return bool(aligned) and (all(fixed for fixed, _ in aligned) or any(fixed and size != 1 for fixed, size in aligned))


@contextlib.contextmanager
def varying_iterations(locate: Callable[[], str | None]) -> Iterator[list[str]]:
    """Where (``locate()`` of the caller) traced code iterated over a tensor (``q, k, v = qkv``, ``for row
    in x``) whose first dimension's size :func:`_fixed_size` cannot show to be constant.

    ``Tensor.__iter__`` is ``iter(self.unbind(0))``: the trace holds one part per element of the first
    batch. When some part is used, ORT's ``Split`` fails loudly on a batch of another size; when none is
    (``sum(1 for _ in x)``, ``for i, _ in enumerate(x)``) the Python count alone stays frozen, silently.
    Over a constant size the count cannot change. The TracerWarning ``__iter__`` gives is left out: the
    guard refuses the recorded iterations with a reason of its own."""
    seen: list[str] = []
    original = torch.Tensor.__iter__

    def __iter__(self: torch.Tensor) -> Iterator[torch.Tensor]:
        if not torch.jit.is_tracing() or self.dim() == 0:
            return original(self)
        if not _fixed_size(torch._C._get_value_trace(self), 0):
            location = locate()  # None inside torch's own code, whose warnings the guard ignored before
            if location is not None and location not in seen:
                seen.append(location)
        return iter(self.unbind(0))  # what Tensor.__iter__ does, without its warning

    torch.Tensor.__iter__ = __iter__  # type: ignore[method-assign,assignment]
    try:
        yield seen
    finally:
        torch.Tensor.__iter__ = original  # type: ignore[method-assign]


@contextlib.contextmanager
def fixed_size_numbers() -> Iterator[None]:
    """Within the block, ``float()`` and ``int()`` of a traced size of a dimension :func:`_fixed_size`
    shows to be constant (minGPT's ``1.0 / math.sqrt(k.size(-1))``, a head's width) give the number
    without torch's TracerWarning, which the guard refuses: no input's size can change it, so the
    trace may hold it as a constant. Other conversions are left to torch (and its warning)."""
    originals = {name: getattr(torch.Tensor, name) for name in ("__float__", "__int__")}

    def constant_size(original: Any) -> Any:
        @functools.wraps(original)
        def convert(self: torch.Tensor) -> Any:
            if torch.jit.is_tracing() and self.dim() == 0 and _is_fixed_size_read(self):
                state = torch._C._get_tracing_state()
                torch._C._set_tracing_state(None)  # read the number without recording (or warning about) it
                try:
                    return original(self)
                finally:
                    torch._C._set_tracing_state(state)
            return original(self)

        return convert

    for name, original in originals.items():
        setattr(torch.Tensor, name, constant_size(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def _is_fixed_size_read(tensor: torch.Tensor) -> bool:
    """Whether the traced 0-d ``tensor`` is ``x.size(d)`` (or ``x.shape[d]``) of a fixed-size dimension."""
    try:
        node = torch._C._get_value_trace(tensor).node()
    except RuntimeError:  # not part of the trace
        return False
    if node.kind() == "prim::NumToTensor":
        node = next(node.inputs()).node()
    return node.kind() == "aten::size" and _is_fixed_size_node(node)


def _in_subscript(frame: types.FrameType) -> bool:
    """Whether ``frame`` is subscripting (``x[:, :n]``): tensor indexing reads a traced size with
    ``__index__`` but records it in the trace as a dynamic value."""
    if frame.f_code is _SizeListReads.__torch_function__.__code__ and frame.f_back is not None:
        frame = frame.f_back  # indexing dispatched through size_list_reads' mode: the subscript is its caller
    return dis.opname[frame.f_code.co_code[frame.f_lasti]] in _SUBSCRIPTS


def parameter_versions(module: torch.nn.Module) -> dict[str, int]:
    """Every parameter's in-place modification counter."""
    return {name: parameter._version for name, parameter in module.named_parameters()}


def changed_in_place(module: torch.nn.Module, versions: dict[str, int]) -> list[str]:
    """Parameters modified in place since ``versions`` was taken."""
    return [name for name, parameter in module.named_parameters() if versions.get(name, -1) != parameter._version]


@contextlib.contextmanager
def input_copies() -> Iterator[list[tuple[torch.Tensor, int]]]:
    """The copies of the module's input tensors ORT's export runs the forward on, with their
    in-place modification counters when copied."""
    from onnxruntime.training.ortmodule import _io

    copies: list[tuple[torch.Tensor, int]] = []
    original = _io.deepcopy_model_input

    def deepcopy_model_input(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        values = (*result[0], *result[1].values())
        # inference tensors (torch.inference_mode(): predict, validate) have no counter and go unchecked
        copies.extend(
            (value, value._version) for value in values if torch.is_tensor(value) and not value.is_inference()
        )
        return result

    _io.deepcopy_model_input = deepcopy_model_input
    try:
        yield copies
    finally:
        _io.deepcopy_model_input = original


def changed_inputs(copies: list[tuple[torch.Tensor, int]]) -> bool:
    """Whether the forward changed any of ``copies`` in place."""
    return any(tensor._version != version for tensor, version in copies)


def sparse_embeddings(module: torch.nn.Module) -> list[str]:
    """Embedding layers with ``sparse=True``."""
    layers = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    return [name for name, layer in module.named_modules() if isinstance(layer, layers) and layer.sparse]


def hooks_problem(owner: torch.nn.Module, modules: list[torch.nn.Module]) -> str | None:
    """Why Python forward hooks on ``owner``'s submodules (``modules``: ``owner.modules()``) would not
    work under ORT, if there are any (the owner's own hooks run around lightning_ort's forward,
    outside ORT, as in eager)."""
    from torch.nn.modules import module as torch_module

    global_hooks = torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks
    # runs before every call: the common case (no hooks) without building names
    if not global_hooks and not any(
        submodule._forward_hooks or submodule._forward_pre_hooks for submodule in modules if submodule is not owner
    ):
        return None
    hooked = []
    for name, submodule in owner.named_modules():
        hooks: list[Any] = [*submodule._forward_hooks.values(), *submodule._forward_pre_hooks.values()]
        if submodule is not owner and any(not isinstance(hook, _TRACEABLE_HOOKS) for hook in hooks):
            hooked.append(name)
    if not hooked and not global_hooks:
        return None
    where = f"submodule(s) {', '.join(hooked)}" if hooked else "every module (register_module_forward_hook)"
    return (
        f"forward hooks are registered on {where}; ORT runs the traced graph and calls no Python hook after "
        "the export, so what a hook captures would be stale. Fix: return the tensors from forward instead, or "
        "keep that module out of ORT with ORTStrategy(modules=[...])"
    )
