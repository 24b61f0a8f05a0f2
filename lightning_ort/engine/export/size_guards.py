"""Python branches on tensor sizes, kept as guards checked before every call instead of refused.

The export traces ``forward`` once: ``if kv_length + kv_offset - mask.shape[-1] > 0`` (every Hugging
Face model's mask helpers), ``if h.shape[0] != 16`` take the branch the export's batch took, and the
graph holds that branch only. As torch.compile does with its guards, lightning_ort records each such
decision while the export traces (the 0-d tensor Python turned into a bool, and the trace that
computed it) as an expression over the sizes of ``forward``'s inputs, with the answer the trace took.
Before each call of the graph the guard evaluates those expressions on the call's inputs (integer
arithmetic, no tensor work); when one gives another answer, the graph does not hold for this call
and ORT exports the module again (``guard.py``), the new export recording its own decisions.

A decision is kept as a guard only when every size it reads can be followed back through the trace
to a dimension of an input (or to a constant: a parameter's shape, a number in a ``view``) by the
operators :func:`_size` knows; a branch on values computed from the inputs alone (``mask.all()``) is
kept the same way, its computation followed by ``value_guards.py``; anything else (a size after a
data-dependent operator such as ``nonzero``, a value read through a parameter) stays refused by the
export's checks with the line that branched.

Over 300 lines because the shape rules of the operators it follows (:func:`_size`) belong with the
recording and the check that use them; the op registry of issue #30 is where they would move.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import operator
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree

from lightning_ort.engine.export import value_guards
from lightning_ort.engine.export.tracing_state import untraced, warned_at_caller
from lightning_ort.engine.export.value_traces import value_trace

log = logging.getLogger(__name__)

# A node of a size program: ("const", number) | ("size", argument name, leaf index, dim) | (operator, *operand
# nodes' positions); a program lists its nodes operands first, so it runs in one pass
Node = tuple[Any, ...]
_MAX_DEPTH = 200

_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "floordiv": operator.floordiv, "floor_divide": operator.floordiv, "remainder": operator.mod,
    "gt": operator.gt, "lt": operator.lt, "ge": operator.ge, "le": operator.le, "eq": operator.eq, "ne": operator.ne,
    "__and__": operator.and_, "__or__": operator.or_, "bitwise_and": operator.and_, "bitwise_or": operator.or_,
    "logical_and": lambda a, b: bool(a) and bool(b), "logical_or": lambda a, b: bool(a) or bool(b),
    "maximum": max, "minimum": min, "max": max, "min": min, "pow": operator.pow,
}  # fmt: skip
_UNARY: dict[str, Callable[[Any], Any]] = {
    "neg": operator.neg, "abs": abs, "logical_not": operator.not_, "bitwise_not": lambda a: not a if isinstance(
        a, bool) else ~a,
}  # fmt: skip
# Operators that hand their number through unchanged (the trace's wrappers around sizes)
_NUMBER_PASSING = frozenset(
    {"prim::NumToTensor", "aten::Int", "aten::ScalarImplicit", "aten::Float", "aten::Bool", "aten::detach",
     "aten::clone", "aten::contiguous", "aten::alias", "aten::lift_fresh"}
)  # fmt: skip
# Tensor operators whose output has their first input's shape
_SAME_SHAPE = frozenset(
    f"aten::{name}"
    for name in (
        "contiguous", "clone", "detach", "to", "type_as", "dropout", "feature_dropout", "alpha_dropout", "relu",
        "gelu", "silu", "tanh", "sigmoid", "softmax", "log_softmax", "layer_norm", "group_norm", "batch_norm",
        "rms_norm", "neg", "exp", "log", "sqrt", "rsqrt", "abs", "sin", "cos", "erf", "logical_not", "bitwise_not",
        "cumsum", "cumprod", "triu", "tril", "float", "long", "int", "bool", "half", "bfloat16", "masked_fill",
        "clamp", "clamp_min", "clamp_max", "fill", "ones_like", "zeros_like", "full_like", "empty_like", "rand_like",
        "randn_like", "alias", "lift_fresh", "pow", "reciprocal", "square", "sign", "hardtanh", "elu", "leaky_relu",
        "mish", "softplus", "hardswish", "hardsigmoid", "native_dropout",
    )
)  # fmt: skip
# Element-wise operators whose output broadcasts their tensor inputs
_BROADCASTING = frozenset(
    f"aten::{name}"
    for name in (
        "add", "sub", "mul", "div", "where", "masked_fill", "eq", "ne", "lt", "gt", "le", "ge", "pow", "__and__",
        "__or__", "bitwise_and", "bitwise_or", "logical_and", "logical_or", "maximum", "minimum", "remainder",
        "floor_divide", "rsub", "atan2",
    )
)  # fmt: skip
_FACTORIES = frozenset(f"aten::{name}" for name in ("ones", "zeros", "empty", "full", "rand", "randn", "new_ones",
                                                     "new_zeros", "new_empty", "new_full"))  # fmt: skip
# Reductions over listed dimensions: (input, dims, keepdim, ...)
_REDUCTIONS = frozenset(f"aten::{name}" for name in ("mean", "sum", "amax", "amin", "var", "std", "logsumexp"))
_GUARDS: weakref.WeakKeyDictionary[torch.nn.Module, SizeGuards] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class SizeDecision:
    """One Python branch on sizes: the node of its program that computes it from the inputs' sizes, the
    answer the export took, and where it branched."""

    expression: int
    answer: Any
    location: str


@dataclass
class SizeGuards:
    """The decisions each of a module's graphs holds (by ``graph``: training or inference), the graph the
    guard is calling now, and what the export in progress records."""

    graphs: dict[bool, tuple[list[Node], list[SizeDecision]]] = field(default_factory=dict)
    calling: bool = True
    # those of a cached export (export_cache.py), which runs no trace: taken over when it is reused
    restored: tuple[list[Node], list[SizeDecision]] = ([], [])
    # the arguments of the call being made (the export it may start reuses a cached graph only if they fit it)
    arguments: tuple[tuple[Any, ...], dict[str, Any]] | None = None


def guards_of(adapter: torch.nn.Module) -> SizeGuards:
    """The size guards of the module ORT runs (lightning_ort's ForwardAdapter). Kept outside the module: the
    export cache keys a module by its attributes, and these change with every call."""
    guards = _GUARDS.get(adapter)
    if guards is None:
        guards = _GUARDS[adapter] = SizeGuards()
    return guards


def _bound(adapter: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """``forward``'s arguments by parameter name, as the call gives them (None when they do not bind)."""
    try:
        return dict(inspect.signature(adapter.forward).bind(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        return None


def _leaves(arguments: dict[str, Any]) -> Iterator[tuple[str, int, Any]]:
    for name, value in arguments.items():
        for index, leaf in enumerate(_pytree.tree_leaves(value)):
            yield name, index, leaf


# --- following a traced number back to the inputs' sizes ------------------------------------------------


class _Unknown(Exception):
    """The trace computes a size by something :func:`_size` does not follow (its message: the operator)."""


def _constant(value: torch._C.Value) -> Any:
    constant = value.toIValue()
    if isinstance(constant, torch.Tensor):
        if constant.dim() != 0:
            raise _Unknown
        return constant.item()
    return constant


def _listed_constant(value: torch._C.Value) -> Any:
    """A constant, or a list built of constants (``prim::ListConstruct``)."""
    if value.node().kind() == "prim::ListConstruct":
        return [_constant(element) for element in value.node().inputs()]
    return _constant(value)


class _Follower:
    """Builds expressions for the open trace's values, given the trace values of the inputs' tensors."""

    def __init__(self, inputs: dict[int, tuple[str, int]]) -> None:
        self.inputs = inputs
        self.memo: dict[tuple[int, int], int] = {}
        self.nodes: list[Node] = []
        self._positions: dict[Node, int] = {}

    def clear(self) -> None:
        """A new trace: its values' numbers start again."""
        self.memo.clear()
        self.nodes.clear()
        self._positions.clear()

    def _node(self, kind: str, *operands: Any) -> int:
        """The position of the node ``(kind, *operands)``, shared with an equal one made before."""
        node = (kind, *operands)
        position = self._positions.get(node)
        if position is None:
            position = self._positions[node] = len(self.nodes)
            self.nodes.append(node)
        return position

    def _const(self, number: Any) -> int:
        return self._node("const", number)

    def _broadcast(self, operands: list[int]) -> int:
        """The size a broadcast gives dimensions of these sizes: one operand where the others are it or 1."""
        distinct = [operand for index, operand in enumerate(operands) if operand not in operands[:index]]
        sized = [operand for operand in distinct if self.nodes[operand] != ("const", 1)] or distinct[:1]
        return sized[0] if len(sized) == 1 else self._node("broadcast", *sized)

    def number(self, value: torch._C.Value, depth: int = 0) -> int:
        key = (value.unique(), -1)
        if key not in self.memo:
            self.memo[key] = self._number(value, depth)
        return self.memo[key]

    def size(self, value: torch._C.Value, dim: int, depth: int = 0) -> int:
        rank = value.type().dim() if isinstance(value.type(), torch._C.TensorType) else None
        if rank is None or not -rank <= dim < rank or depth > _MAX_DEPTH:
            raise _Unknown
        dim %= rank
        key = (value.unique(), dim)
        if key not in self.memo:
            self.memo[key] = self._size(value, dim, rank, depth + 1)
        return self.memo[key]

    def _number(self, value: torch._C.Value, depth: int) -> int:
        if depth > _MAX_DEPTH:
            raise _Unknown
        node = value.node()
        kind = node.kind()
        inputs = list(node.inputs())
        if kind == "prim::Constant":
            constant = _constant(value)
            if constant is None or isinstance(constant, (int, float, bool)):
                return self._const(constant)
            raise _Unknown
        if kind == "aten::size" and len(inputs) == 2:
            dim = _constant(inputs[1])
            if not isinstance(dim, int):
                raise _Unknown
            return self.size(inputs[0], dim, depth + 1)
        if kind == "aten::numel":
            rank = inputs[0].type().dim()
            if rank is None:
                raise _Unknown
            return self._node("prod", *(self.size(inputs[0], dim, depth + 1) for dim in range(rank)))
        if kind in _NUMBER_PASSING:
            return self.number(inputs[0], depth + 1)
        if kind == "aten::to" or kind == "aten::type_as":
            return self.number(inputs[0], depth + 1)
        name = kind.partition("::")[2]
        if kind in ("aten::add", "aten::sub") and len(inputs) == 3:
            if _constant(inputs[2]) != 1:  # alpha
                raise _Unknown
            inputs = inputs[:2]
        if name == "rsub" and len(inputs) == 3 and _constant(inputs[2]) == 1:
            return self._node("sub", self.number(inputs[1], depth + 1), self.number(inputs[0], depth + 1))
        if name in _BINARY and len(inputs) == 2:
            return self._node(name, self.number(inputs[0], depth + 1), self.number(inputs[1], depth + 1))
        if name in _UNARY and len(inputs) == 1:
            return self._node(name, self.number(inputs[0], depth + 1))
        raise _Unknown(kind)

    def _size(self, value: torch._C.Value, dim: int, rank: int, depth: int) -> int:
        node = value.node()
        kind = node.kind()
        inputs = list(node.inputs())
        if kind == "prim::Param":
            where = self.inputs.get(value.unique())
            if where is not None:
                return self._node("size", *where, dim)
            return self._known(value, dim)  # a parameter or buffer: its shape changes only with a new export
        if kind == "prim::Constant":
            return self._known(value, dim)
        if kind in _BROADCASTING:
            operands = [
                self.size(operand, dim - (rank - operand.type().dim()), depth)
                for operand in inputs
                if isinstance(operand.type(), torch._C.TensorType)
                and operand.type().dim() is not None
                and dim - (rank - operand.type().dim()) >= 0
            ]
            if not operands:
                raise _Unknown
            return self._broadcast(operands)
        if kind in _SAME_SHAPE or _in_place(kind):
            return self.size(inputs[0], dim, depth)
        if kind == "aten::embedding":
            return self._known(value, dim) if dim == rank - 1 else self.size(inputs[1], dim, depth)
        if kind == "aten::linear":
            return self._known(value, dim) if dim == rank - 1 else self.size(inputs[0], dim, depth)
        if kind == "aten::permute":
            order = _constant(inputs[1])
            return self.size(inputs[0], order[dim], depth)
        if kind == "aten::transpose":
            first, second = (_constant(inputs[1]) % rank, _constant(inputs[2]) % rank)
            return self.size(inputs[0], {first: second, second: first}.get(dim, dim), depth)
        if kind == "aten::t":
            return self.size(inputs[0], (rank - 1 - dim) if rank == 2 else dim, depth)
        if kind == "aten::unsqueeze":
            position = _constant(inputs[1]) % rank
            return self._const(1) if dim == position else self.size(inputs[0], dim - (dim > position), depth)
        if kind == "aten::select":
            position = _constant(inputs[1]) % (rank + 1)
            return self.size(inputs[0], dim + (dim >= position), depth)
        if kind == "aten::slice":
            position = _constant(inputs[1]) % rank
            whole = self.size(inputs[0], dim, depth)
            if dim != position:
                return whole
            bounds = [self.number(bound, depth) for bound in inputs[2:5]]
            return self._node("slice", whole, *bounds)
        if kind in ("aten::reshape", "aten::view", "aten::expand", *_FACTORIES):
            return self._listed(kind, inputs, dim, rank, depth)
        if kind == "aten::arange":
            # arange(end, ...), arange(start, end, ...), arange(start, end, step, ...)
            numbers = [
                operand
                for operand in inputs
                if operand.type().kind() in ("IntType", "FloatType", "NumberType", "TensorType")
            ]
            bounds = [self.number(operand, depth) for operand in numbers[:3]]
            if len(bounds) == 1:
                bounds = [self._const(0), bounds[0], self._const(1)]
            elif len(bounds) == 2:
                bounds.append(self._const(1))
            return self._node("arange", *bounds)
        if kind in ("aten::mm", "aten::addmm", "aten::matmul", "aten::bmm", "aten::baddbmm"):
            first, second = inputs[1:3] if kind in ("aten::addmm", "aten::baddbmm") else inputs[:2]
            return self._matmul(first, second, dim, rank, depth)
        if kind == "aten::scaled_dot_product_attention":  # query's shape, with value's last dimension
            return self.size(inputs[2] if dim == rank - 1 else inputs[0], dim - rank, depth)
        if kind in ("aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d"):
            return self._convolution(kind, value, inputs, dim, depth)
        if kind in _REDUCTIONS and len(inputs) >= 3:
            return self._reduced(inputs, dim, rank, depth)
        if kind == "aten::gather":  # the index's shape
            return self.size(inputs[2], dim, depth)
        if kind == "aten::index_select":
            return (
                self.size(inputs[2], 0, depth)
                if dim == _constant(inputs[1]) % rank
                else self.size(inputs[0], dim, depth)
            )
        if kind == "prim::ListUnpack":
            return self._part(value, inputs[0].node(), dim, depth)
        if kind == "aten::cat":
            parts = list(inputs[0].node().inputs()) if inputs[0].node().kind() == "prim::ListConstruct" else None
            position = _constant(inputs[1])
            # torch.cat skips 1-D empty tensors of any other rank (a cache's torch.tensor([]) before its first update)
            parts = [part for part in parts or [] if rank == 1 or not _empty_vector(part)]
            if not parts:
                raise _Unknown
            position %= rank
            if dim != position:
                return self.size(parts[0], dim, depth)
            return self._node("sum", *(self.size(part, dim, depth) for part in parts))
        raise _Unknown(kind)

    def _convolution(self, kind: str, value: torch._C.Value, inputs: list[torch._C.Value], dim: int, depth: int) -> int:
        """A dimension of a (not transposed) convolution: the batch's, the weight's channels, each spatial size from
        the input's by the kernel, stride, padding and dilation (constants)."""
        stride, padding, dilation = (_listed_constant(operand) for operand in inputs[3:6])
        if not isinstance(stride, (list, tuple)) or inputs[0].type().dim() != len(stride) + 2 or dim >= len(stride) + 2:
            raise _Unknown("an unbatched convolution")
        if dim == 0:
            return self.size(inputs[0], 0, depth)
        if dim == 1:
            return self._known(value, 1)
        if kind == "aten::_convolution" and _constant(inputs[6]):  # transposed
            raise _Unknown("a transposed convolution")
        if not all(isinstance(listed, (list, tuple)) for listed in (stride, padding, dilation)):
            raise _Unknown("a convolution with padding='same' or sizes it cannot read")
        kernel = inputs[1].type().sizes()
        if kernel is None or kernel[dim] is None:
            raise _Unknown("a convolution with a kernel of unknown size")
        axis = dim - 2
        size = self.size(inputs[0], dim, depth)
        return self._node(
            "conv", size, self._const(kernel[dim]), self._const(stride[axis]), self._const(padding[axis]),
            self._const(dilation[axis]),
        )  # fmt: skip

    def _reduced(self, inputs: list[torch._C.Value], dim: int, rank: int, depth: int) -> int:
        """A dimension of ``mean``/``sum``/``amax``/``amin`` over constant dimensions, kept (as 1) or dropped."""
        source_rank = inputs[0].type().dim()
        listed = inputs[1].node()
        dims = (
            [_constant(d) for d in listed.inputs()] if listed.kind() == "prim::ListConstruct" else _constant(inputs[1])
        )
        keepdim = _constant(inputs[2])
        if isinstance(dims, int):
            dims = [dims]
        if (
            not isinstance(dims, (list, tuple))
            or not all(isinstance(axis, int) for axis in dims)
            or not isinstance(keepdim, bool)
            or source_rank is None
        ):
            raise _Unknown("a reduction over dimensions it cannot read")
        reduced = {axis % source_rank for axis in dims} if dims else set(range(source_rank))
        if keepdim:
            return self._const(1) if dim in reduced else self.size(inputs[0], dim, depth)
        kept = [axis for axis in range(source_rank) if axis not in reduced]
        return self.size(inputs[0], kept[dim], depth)

    def _matmul(self, first: torch._C.Value, second: torch._C.Value, dim: int, rank: int, depth: int) -> int:
        """A dimension of ``first @ second``, both of rank 2 or more: rows from ``first``, columns from ``second``,
        the batch dimensions broadcast."""
        ranks = (first.type().dim(), second.type().dim())
        if None in ranks or min(ranks) < 2:  # type: ignore[type-var]
            raise _Unknown("matmul of a vector")
        if dim == rank - 1:
            return self.size(second, -1, depth)
        if dim == rank - 2:
            return self.size(first, -2, depth)
        pairs = zip((first, second), ranks, strict=True)
        operands = [
            self.size(operand, dim - rank, depth) for operand, operand_rank in pairs if dim >= rank - operand_rank
        ]
        return self._broadcast(operands)

    def _part(self, value: torch._C.Value, split: torch._C.Node, dim: int, depth: int) -> int:
        """A dimension of part ``value.offset()`` of a ``split``, ``split_with_sizes``, ``chunk`` or ``unbind``."""
        kind = split.kind()
        inputs = list(split.inputs())
        index = value.offset()
        if kind == "aten::unbind":
            position = _constant(inputs[1]) % (value.type().dim() + 1)
            return self.size(inputs[0], dim + (dim >= position), depth)
        if kind not in ("aten::split", "aten::unsafe_split", "aten::split_with_sizes", "aten::chunk"):
            raise _Unknown(kind)
        position = _constant(inputs[2]) % value.type().dim()
        whole = self.size(inputs[0], dim, depth)
        if dim != position:
            return whole
        if kind == "aten::chunk":
            return self._node("chunk", whole, self.number(inputs[1], depth), self._const(index))
        if inputs[1].node().kind() == "prim::ListConstruct":  # split_with_sizes, or split given a list
            return self.number(list(inputs[1].node().inputs())[index], depth)
        sizes = _constant(inputs[1])
        if isinstance(sizes, (list, tuple)):
            return self._const(sizes[index])
        return self._node("split", whole, self.number(inputs[1], depth), self._const(index))

    def _listed(self, kind: str, inputs: list[torch._C.Value], dim: int, rank: int, depth: int) -> int:
        """A dimension of ``reshape``/``view``/``expand`` or of a factory, from the sizes it is given."""
        sizes_value = inputs[0] if kind.partition("::")[2] in ("ones", "zeros", "empty", "full", "rand",
                                                                 "randn") else inputs[1]  # fmt: skip
        if sizes_value.node().kind() == "prim::ListConstruct":
            sizes = [self.number(element, depth) for element in sizes_value.node().inputs()]
        else:
            constant = _constant(sizes_value)
            if not isinstance(constant, (list, tuple)):
                raise _Unknown
            sizes = [self._const(element) for element in constant]
        if len(sizes) != rank:
            raise _Unknown
        size = sizes[dim]
        if kind == "aten::expand":
            source_rank = inputs[0].type().dim()
            aligned = dim - (rank - source_rank)
            return self._node("expand", size, self.size(inputs[0], aligned, depth) if aligned >= 0 else self._const(1))
        if kind in ("aten::reshape", "aten::view"):
            source_rank = inputs[0].type().dim()
            whole = self._node("prod", *(self.size(inputs[0], index, depth) for index in range(source_rank)))
            others = self._node("prod", *(element for index, element in enumerate(sizes) if index != dim))
            return self._node("infer", size, whole, others)
        return size

    def _known(self, value: torch._C.Value, dim: int) -> int:
        sizes = value.type().sizes()
        if sizes is None or sizes[dim] is None:
            raise _Unknown
        return self._const(sizes[dim])


def _empty_vector(value: torch._C.Value) -> bool:
    """Whether ``value`` is a 1-D tensor of size 0 (``torch.tensor([])``)."""
    value_type = value.type()
    try:
        return isinstance(value_type, torch._C.TensorType) and value_type.sizes() == [0]
    except RuntimeError:  # sizes not known
        return False


# In-place operators that change their input's shape
_RESHAPING_IN_PLACE = frozenset(
    f"aten::{name}_"
    for name in ("resize", "resize_as", "set", "squeeze", "unsqueeze", "t", "transpose", "swapdims", "swapaxes",
                 "as_strided", "unfold")
)  # fmt: skip


def _in_place(kind: str) -> bool:
    """An in-place operator (``aten::masked_fill_``, ``aten::copy_``) that returns its first input, shape and all."""
    return (
        kind.startswith("aten::") and kind.endswith("_") and not kind.endswith("__") and kind not in _RESHAPING_IN_PLACE
    )


def evaluate(
    nodes: list[Node], size: Callable[[str, int, int], int], leaf: Callable[[str, int], Any] | None = None
) -> list[Any]:
    """The value of each of the program's ``nodes``, with ``size(argument, leaf, dim)`` giving the inputs' sizes
    and ``leaf(argument, leaf)`` the inputs themselves (for branches on their values, ``value_guards.py``)."""
    values: list[Any] = []
    for kind, *operands in nodes:
        if kind == "const":
            values.append(operands[0])
        elif kind == "size":
            values.append(size(*operands))
        elif kind == "input":
            if leaf is None:
                raise LookupError("the inputs' values are needed")
            values.append(leaf(*operands))
        elif kind in _VALUE_NODES:
            metadata = _VALUE_NODES[kind]
            values.append(value_guards.apply(kind, operands[:metadata], [values[o] for o in operands[metadata:]]))
        else:
            values.append(_apply(kind, [values[operand] for operand in operands]))
    return values


def _apply(kind: str, values: list[Any]) -> Any:
    if kind in _BINARY:
        return _BINARY[kind](*values)
    if kind in _UNARY:
        return _UNARY[kind](*values)
    if kind == "prod":
        return math.prod(values)
    if kind == "sum":
        return sum(values)
    if kind == "broadcast":
        if any(value not in (1, max(values)) for value in values):
            raise ValueError(f"sizes {values} do not broadcast")
        return max(values)
    if kind == "slice":
        whole, start, stop, step = values
        return len(range(*slice(start, stop, step).indices(whole)))
    if kind == "arange":
        start, stop, step = values
        return max(0, math.ceil((stop - start) / step))
    if kind == "split":  # part `index` of a split into parts of `size`: the last one holds what is left
        whole, size, index = values
        return max(0, min(size, whole - index * size))
    if kind == "chunk":  # torch.chunk: parts of ceil(whole / chunks)
        whole, chunks, index = values
        size = -(-whole // chunks)
        return max(0, min(size, whole - index * size))
    if kind == "conv":
        size, kernel, stride, padding, dilation = values
        return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    if kind == "expand":
        wanted, source = values
        return source if wanted == -1 else wanted
    if kind == "infer":
        wanted, whole, others = values
        return whole // others if wanted == -1 else wanted
    raise ValueError(f"unknown size operator {kind}")


# Nodes of value_guards.py, with the number of their operands that are not positions of other nodes
_VALUE_NODES = {"aten": 3, "list": 0}
_LEAVES = ("const", "size", "input")


def _operand_positions(kind: str, operands: list[Any]) -> list[Any]:
    return [] if kind in _LEAVES else operands[_VALUE_NODES.get(kind, 0) :]


def _program(nodes: list[Node], decisions: list[SizeDecision]) -> tuple[list[Node], list[SizeDecision]]:
    """The nodes the decisions read, renumbered in order, and the decisions pointing into them."""
    needed: set[int] = set()
    pending = [decision.expression for decision in decisions]
    while pending:
        position = pending.pop()
        if position not in needed:
            needed.add(position)
            kind, *operands = nodes[position]
            pending.extend(_operand_positions(kind, operands))
    order = sorted(needed)
    renumbered = {old: new for new, old in enumerate(order)}
    program = []
    for old in order:
        kind, *operands = nodes[old]
        metadata = 0 if kind in _LEAVES else _VALUE_NODES.get(kind, 0)
        if kind in _LEAVES:
            program.append(nodes[old])
        else:
            program.append((kind, *operands[:metadata], *(renumbered[o] for o in operands[metadata:])))
    return program, [SizeDecision(renumbered[d.expression], d.answer, d.location) for d in decisions]


# --- recording during the export, checking before each call ----------------------------------------------


@dataclass
class _Recording:
    """What the export in progress found: the size program and its decisions."""

    follower: _Follower
    decisions: list[SizeDecision] = field(default_factory=list)


@contextlib.contextmanager
def recorded_decisions(adapter: torch.nn.Module, locate: Callable[[], str | None]) -> Iterator[_Recording]:
    """While the export traces ``adapter``'s forward, answer ``bool()`` of a traced size decision (a
    comparison of sizes computed from the inputs' sizes) without torch's TracerWarning, and record it.
    Other conversions are left to torch, and the export's checks refuse them as before. The decisions
    become the graph's guards when the export succeeds (:func:`keep_decisions`)."""
    inputs: dict[int, tuple[str, int]] = {}
    recording = _Recording(_Follower(inputs))
    follower = recording.follower

    def note_inputs(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not torch.jit.is_tracing():
            return
        inputs.clear()
        follower.clear()
        recording.decisions.clear()
        arguments = _bound(adapter, args, kwargs) or {}
        for name, index, leaf in _leaves(arguments):
            value = value_trace(leaf) if isinstance(leaf, torch.Tensor) else None
            if value is not None and value.node().kind() == "prim::Param":
                inputs[value.unique()] = (name, index)

    original = torch.Tensor.__bool__

    @functools.wraps(original)
    def __bool__(self: torch.Tensor) -> bool:
        if not torch.jit.is_tracing() or self.dim() != 0 or not inputs:
            return original(self)
        value = value_trace(self)
        try:
            expression = follower.number(value) if value is not None else None
        except (_Unknown, RecursionError, RuntimeError, TypeError, AttributeError, IndexError, KeyError) as error:
            log.debug("lightning_ort: a branch at %s reads what the size guards do not follow: %r", locate(), error)
            expression = _on_input_values(follower, value, locate)
            if expression is not None and not _reads_tensors_only(adapter, follower.nodes, expression):
                expression = None  # a Python number argument (fed as a tensor by ORT): refused, naming it
        if expression is None or not _reads_a_size(follower.nodes, expression):
            # a branch on data, or on sizes it cannot follow: torch warns (at the caller's line), the export refuses
            return warned_at_caller(original, self)
        with untraced():
            answer = original(self)
        decision = SizeDecision(expression, answer, locate() or _caller())
        if decision not in recording.decisions:
            recording.decisions.append(decision)
        return answer

    handle = adapter.register_forward_pre_hook(note_inputs, with_kwargs=True)
    torch.Tensor.__bool__ = __bool__  # type: ignore[method-assign]
    try:
        yield recording
    finally:
        torch.Tensor.__bool__ = original  # type: ignore[method-assign]
        handle.remove()


def _on_input_values(follower: _Follower, value: torch._C.Value | None, locate: Callable[[], str | None]) -> int | None:
    """The node computing a branch's value from the inputs' values and sizes, or None (value_guards.py)."""
    if value is None:
        return None
    try:
        return value_guards.follow(follower, value)
    except (value_guards.NotAnInputValue, _Unknown, RecursionError, RuntimeError, TypeError, AttributeError,
            IndexError, KeyError, ValueError) as error:  # fmt: skip
        log.debug("lightning_ort: a branch at %s reads what the value guards do not follow: %r", locate(), error)
        return None


def _reads_tensors_only(adapter: torch.nn.Module, nodes: list[Node], position: int) -> bool:
    """Whether every input whose value the node reads is a tensor in the call being made (a Python number
    argument the graph gets as a tensor has its own refusal, which names it and the fix)."""
    arguments = guards_of(adapter).arguments
    bound = _bound(adapter, *arguments) if arguments is not None else None
    if bound is None:
        return False
    leaves = {(name, index): leaf for name, index, leaf in _leaves(bound)}
    program, _ = _program(nodes, [SizeDecision(position, None, "")])
    read = [node[1:3] for node in program if node[0] == "input"]
    return all(isinstance(leaves.get(tuple(where)), torch.Tensor) for where in read)


def _caller() -> str:
    frame = sys._getframe(2)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _reads_a_size(nodes: list[Node], position: int) -> bool:
    """Whether the node reads an input's size or value (else it is a constant, which needs no guard)."""
    program, _ = _program(nodes, [SizeDecision(position, None, "")])
    return any(node[0] in ("size", "input") for node in program)


def keep_decisions(adapter: torch.nn.Module, recording: _Recording, traced: bool) -> None:
    """After a successful export for the graph the guard is calling: its decisions (those of the cached
    export, when it ``traced`` nothing) are that graph's guards."""
    guards = guards_of(adapter)
    found = _program(recording.follower.nodes, recording.decisions) if traced else guards.restored
    guards.graphs[guards.calling] = found
    guards.arguments = None


def to_record(adapter: torch.nn.Module) -> dict[str, Any]:
    """The decisions of the graph just exported, in JSON's types, to be kept with a cached export."""
    guards = guards_of(adapter)
    nodes, decisions = guards.graphs.get(guards.calling, ([], []))
    return {
        "nodes": [list(node) for node in nodes],
        "decisions": [[decision.expression, decision.answer, decision.location] for decision in decisions],
    }


def from_record(adapter: torch.nn.Module, record: dict[str, Any]) -> str | None:
    """Take over the decisions kept with a cached export (:func:`to_record`); why they cannot be (a decision
    the call being made answers otherwise: the cached graph took another branch), or None."""
    nodes = [tuple(node) for node in record["nodes"]]
    decisions = [SizeDecision(position, answer, location) for position, answer, location in record["decisions"]]
    guards = guards_of(adapter)
    if decisions:
        if guards.arguments is None:
            return "its branches on sizes or values cannot be checked for this call"
        problem = _first_changed(adapter, nodes, decisions, *guards.arguments)
        if problem is not None:
            return problem
    guards.restored = (nodes, decisions)
    return None


def changed_decision(
    adapter: torch.nn.Module, graph: bool, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> str | None:
    """Before a call of ``graph`` (training or inference) with ``args`` and ``kwargs``: the first decision on
    sizes that graph holds which the call's inputs would answer otherwise (where it branched, and how), or
    None when all hold (or the graph holds none)."""
    guards = guards_of(adapter)
    guards.calling = graph
    guards.arguments = (args, kwargs)
    nodes, decisions = guards.graphs.get(graph, ([], []))
    return _first_changed(adapter, nodes, decisions, args, kwargs) if decisions else None


def _first_changed(
    adapter: torch.nn.Module,
    nodes: list[Node],
    decisions: list[SizeDecision],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> str | None:
    """The first of ``decisions`` the call with ``args`` and ``kwargs`` answers otherwise, said in words."""
    arguments = _bound(adapter, args, kwargs)
    leaves = {} if arguments is None else {(name, index): leaf for name, index, leaf in _leaves(arguments)}

    def size(name: str, index: int, dim: int) -> int:
        leaf = leaves.get((name, index))
        if not isinstance(leaf, torch.Tensor) or dim >= leaf.dim():
            raise LookupError(f"input {name} is not the tensor the export saw")
        return leaf.shape[dim]

    def leaf(name: str, index: int) -> torch.Tensor:
        found = leaves.get((name, index))
        if not isinstance(found, torch.Tensor):
            raise LookupError(f"input {name} is not the tensor the export saw")
        return found.detach()

    try:
        with torch.no_grad():
            values = evaluate(nodes, size, leaf)
            answers = [_answer(values[decision.expression]) for decision in decisions]
    except (LookupError, ArithmeticError, TypeError, ValueError, RuntimeError) as error:
        return f"the branches on sizes at {decisions[0].location} cannot be checked for this call ({error})"
    for decision, answer in zip(decisions, answers, strict=True):
        if answer != decision.answer:
            program, _ = _program(nodes, [decision])
            what = "values" if any(node[0] == "input" for node in program) else "sizes"
            return (
                f"a branch on {what} at {decision.location} goes the other way for this call's input {what} "
                f"({decision.answer} at the export, {answer} now)"
            )
    return None


def _answer(value: Any) -> Any:
    """A branch's value as the export's decision holds it: a tensor (of a branch on values) as a bool."""
    return bool(value) if isinstance(value, torch.Tensor) else value


def forget_graph(adapter: torch.nn.Module, graph: bool) -> None:
    """The graph will be exported again: its decisions no longer hold anything."""
    guards_of(adapter).graphs.pop(graph, None)
