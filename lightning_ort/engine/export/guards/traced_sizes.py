"""Following a number of the open trace back to the sizes of ``forward``'s inputs: the size rules of the
operators a size guard reads through (:class:`SizeFollower`), writing the computation as a size program
(``size_programs.py``).

Over 300 lines because the shape rules of the operators it follows (:meth:`SizeFollower._size`) are one
table-like function; the op registry of issue #30 is where they would move.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_ort.engine.export.guards.size_programs import BINARY, UNARY, Node

_MAX_DEPTH = 200
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
        "mish", "softplus", "hardswish", "hardsigmoid", "native_dropout", "ceil", "floor", "round", "trunc", "frac",
        "log1p", "expm1", "log2", "log10", "tan", "atan", "asin", "acos", "sinh", "cosh",
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


class Unknown(Exception):
    """The trace computes a size by something :func:`_size` does not follow (its message: the operator)."""


def _constant(value: torch._C.Value) -> Any:
    constant = value.toIValue()
    if isinstance(constant, torch.Tensor):
        if constant.dim() != 0:
            raise Unknown
        return constant.item()
    return constant


def _listed_constant(value: torch._C.Value) -> Any:
    """A constant, or a list built of constants (``prim::ListConstruct``)."""
    if value.node().kind() == "prim::ListConstruct":
        return [_constant(element) for element in value.node().inputs()]
    return _constant(value)


class SizeFollower:
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

    def node(self, kind: str, *operands: Any) -> int:
        """The position of the node ``(kind, *operands)``, shared with an equal one made before."""
        node = (kind, *operands)
        position = self._positions.get(node)
        if position is None:
            position = self._positions[node] = len(self.nodes)
            self.nodes.append(node)
        return position

    def input_node(self, value: torch._C.Value) -> int | None:
        """The node of the input ``value`` is (a tensor among ``forward``'s arguments), or None when it is
        none of them (a parameter, a buffer)."""
        where = self.inputs.get(value.unique())
        return None if where is None else self.node("input", *where)

    def _const(self, number: Any) -> int:
        return self.node("const", number)

    def _broadcast(self, operands: list[int]) -> int:
        """The size a broadcast gives dimensions of these sizes: one operand where the others are it or 1."""
        distinct = [operand for index, operand in enumerate(operands) if operand not in operands[:index]]
        sized = [operand for operand in distinct if self.nodes[operand] != ("const", 1)] or distinct[:1]
        return sized[0] if len(sized) == 1 else self.node("broadcast", *sized)

    def number(self, value: torch._C.Value, depth: int = 0) -> int:
        key = (value.unique(), -1)
        if key not in self.memo:
            self.memo[key] = self._number(value, depth)
        return self.memo[key]

    def size(self, value: torch._C.Value, dim: int, depth: int = 0) -> int:
        rank = value.type().dim() if isinstance(value.type(), torch._C.TensorType) else None
        if rank is None or not -rank <= dim < rank or depth > _MAX_DEPTH:
            raise Unknown
        dim %= rank
        key = (value.unique(), dim)
        if key not in self.memo:
            self.memo[key] = self._size(value, dim, rank, depth + 1)
        return self.memo[key]

    def _number(self, value: torch._C.Value, depth: int) -> int:
        if depth > _MAX_DEPTH:
            raise Unknown
        node = value.node()
        kind = node.kind()
        inputs = list(node.inputs())
        if kind == "prim::Constant":
            constant = _constant(value)
            if constant is None or isinstance(constant, (int, float, bool)):
                return self._const(constant)
            raise Unknown
        if kind == "aten::size" and len(inputs) == 2:
            dim = _constant(inputs[1])
            if not isinstance(dim, int):
                raise Unknown
            return self.size(inputs[0], dim, depth + 1)
        if kind == "aten::numel":
            rank = inputs[0].type().dim()
            if rank is None:
                raise Unknown
            return self.node("prod", *(self.size(inputs[0], dim, depth + 1) for dim in range(rank)))
        if kind in _NUMBER_PASSING:
            return self.number(inputs[0], depth + 1)
        if kind == "aten::to" or kind == "aten::type_as":
            return self.number(inputs[0], depth + 1)
        name = kind.partition("::")[2]
        if kind in ("aten::add", "aten::sub") and len(inputs) == 3:
            if _constant(inputs[2]) != 1:  # alpha
                raise Unknown
            inputs = inputs[:2]
        if name == "rsub" and len(inputs) == 3 and _constant(inputs[2]) == 1:
            return self.node("sub", self.number(inputs[1], depth + 1), self.number(inputs[0], depth + 1))
        if name in BINARY and len(inputs) == 2:
            return self.node(name, self.number(inputs[0], depth + 1), self.number(inputs[1], depth + 1))
        if name in UNARY and len(inputs) == 1:
            return self.node(name, self.number(inputs[0], depth + 1))
        raise Unknown(kind)

    def _size(self, value: torch._C.Value, dim: int, rank: int, depth: int) -> int:
        node = value.node()
        kind = node.kind()
        inputs = list(node.inputs())
        if kind == "prim::Param":
            where = self.inputs.get(value.unique())
            if where is not None:
                return self.node("size", *where, dim)
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
                raise Unknown
            return self._broadcast(operands)
        if kind in _SAME_SHAPE or _in_place(kind):
            return self.size(inputs[0], dim, depth)
        if kind == "aten::embedding":
            return self._known(value, dim) if dim == rank - 1 else self.size(inputs[1], dim, depth)
        if kind == "aten::linear":
            return self._known(value, dim) if dim == rank - 1 else self.size(inputs[0], dim, depth)
        if kind == "aten::permute":
            order = _listed_constant(inputs[1])  # x.permute(0, 2, 1, 3) traces a list of constants
            return self.size(inputs[0], order[dim], depth)
        if kind == "aten::transpose":
            first, second = (_constant(inputs[1]) % rank, _constant(inputs[2]) % rank)
            return self.size(inputs[0], {first: second, second: first}.get(dim, dim), depth)
        if kind == "aten::t":
            return self.size(inputs[0], (rank - 1 - dim) if rank == 2 else dim, depth)
        if kind == "aten::unsqueeze":
            position = _constant(inputs[1]) % rank
            return self._const(1) if dim == position else self.size(inputs[0], dim - (dim > position), depth)
        if kind == "aten::squeeze" and len(inputs) == 2:  # squeeze(x, d): d is gone when it was of size 1
            source_rank = inputs[0].type().dim()
            if source_rank == rank:
                return self.size(inputs[0], dim, depth)
            position = _constant(inputs[1]) % source_rank
            return self.size(inputs[0], dim + (dim >= position), depth)
        if kind == "aten::select":
            position = _constant(inputs[1]) % (rank + 1)
            return self.size(inputs[0], dim + (dim >= position), depth)
        if kind == "aten::slice":
            position = _constant(inputs[1]) % rank
            whole = self.size(inputs[0], dim, depth)
            if dim != position:
                return whole
            bounds = [self.number(bound, depth) for bound in inputs[2:5]]
            return self.node("slice", whole, *bounds)
        if kind in ("aten::reshape", "aten::view", "aten::expand", *_FACTORIES):
            return self._listed(kind, inputs, dim, rank, depth)
        if kind in ("aten::pad", "aten::constant_pad_nd"):  # F.pad: (before, after) pairs from the last dimension
            return self._padded(inputs, dim, rank, depth)
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
            return self.node("arange", *bounds)
        if kind in ("aten::mm", "aten::addmm", "aten::matmul", "aten::bmm", "aten::baddbmm"):
            first, second = inputs[1:3] if kind in ("aten::addmm", "aten::baddbmm") else inputs[:2]
            return self._matmul(first, second, dim, rank, depth)
        if kind == "aten::scaled_dot_product_attention":  # query's shape, with value's last dimension
            return self.size(inputs[2] if dim == rank - 1 else inputs[0], dim - rank, depth)
        if kind in ("aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d"):
            return self._convolution(kind, value, inputs, dim, depth)
        if kind in _REDUCTIONS and len(inputs) >= 3:
            return self._reduced(inputs, dim, rank, depth)
        if kind == "aten::repeat":  # (x, repeats): x's dimension (aligned to the right) times repeats[dim]
            listed = inputs[1].node()
            times = (
                self.number(list(listed.inputs())[dim], depth)
                if listed.kind() == "prim::ListConstruct"
                else self._const(_constant(inputs[1])[dim])
            )
            aligned = dim - (rank - inputs[0].type().dim())
            return times if aligned < 0 else self.node("mul", self.size(inputs[0], aligned, depth), times)
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
                raise Unknown
            position %= rank
            if dim != position:
                return self.size(parts[0], dim, depth)
            return self.node("sum", *(self.size(part, dim, depth) for part in parts))
        raise Unknown(kind)

    def _convolution(self, kind: str, value: torch._C.Value, inputs: list[torch._C.Value], dim: int, depth: int) -> int:
        """A dimension of a (not transposed) convolution: the batch's, the weight's channels, each spatial size from
        the input's by the kernel, stride, padding and dilation (constants)."""
        stride, padding, dilation = (_listed_constant(operand) for operand in inputs[3:6])
        if not isinstance(stride, (list, tuple)) or inputs[0].type().dim() != len(stride) + 2 or dim >= len(stride) + 2:
            raise Unknown("an unbatched convolution")
        if dim == 0:
            return self.size(inputs[0], 0, depth)
        if dim == 1:
            return self._known(value, 1)
        if kind == "aten::_convolution" and _constant(inputs[6]):  # transposed
            raise Unknown("a transposed convolution")
        if not all(isinstance(listed, (list, tuple)) for listed in (stride, padding, dilation)):
            raise Unknown("a convolution with padding='same' or sizes it cannot read")
        kernel = inputs[1].type().sizes()
        if kernel is None or kernel[dim] is None:
            raise Unknown("a convolution with a kernel of unknown size")
        axis = dim - 2
        size = self.size(inputs[0], dim, depth)
        return self.node(
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
            raise Unknown("a reduction over dimensions it cannot read")
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
            raise Unknown("matmul of a vector")
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
            raise Unknown(kind)
        position = _constant(inputs[2]) % value.type().dim()
        whole = self.size(inputs[0], dim, depth)
        if dim != position:
            return whole
        if kind == "aten::chunk":
            return self.node("chunk", whole, self.number(inputs[1], depth), self._const(index))
        if inputs[1].node().kind() == "prim::ListConstruct":  # split_with_sizes, or split given a list
            return self.number(list(inputs[1].node().inputs())[index], depth)
        sizes = _constant(inputs[1])
        if isinstance(sizes, (list, tuple)):
            return self._const(sizes[index])
        return self.node("split", whole, self.number(inputs[1], depth), self._const(index))

    def _listed(self, kind: str, inputs: list[torch._C.Value], dim: int, rank: int, depth: int) -> int:
        """A dimension of ``reshape``/``view``/``expand`` or of a factory, from the sizes it is given."""
        sizes_value = inputs[0] if kind.partition("::")[2] in ("ones", "zeros", "empty", "full", "rand",
                                                                 "randn") else inputs[1]  # fmt: skip
        sizes = self._numbers(sizes_value, depth)
        if len(sizes) != rank:
            raise Unknown
        size = sizes[dim]
        if kind == "aten::expand":
            source_rank = inputs[0].type().dim()
            aligned = dim - (rank - source_rank)
            return self.node("expand", size, self.size(inputs[0], aligned, depth) if aligned >= 0 else self._const(1))
        if kind in ("aten::reshape", "aten::view"):
            source_rank = inputs[0].type().dim()
            whole = self.node("prod", *(self.size(inputs[0], index, depth) for index in range(source_rank)))
            others = self.node("prod", *(element for index, element in enumerate(sizes) if index != dim))
            return self.node("infer", size, whole, others)
        return size

    def _padded(self, inputs: list[torch._C.Value], dim: int, rank: int, depth: int) -> int:
        """A dimension of ``F.pad``'s output: the input's, plus the two pads that name it (negative ones crop)."""
        pads = self._numbers(inputs[1], depth)
        whole = self.size(inputs[0], dim, depth)
        pair = rank - 1 - dim
        if len(pads) % 2 or len(pads) > 2 * rank:
            raise Unknown("aten::pad")
        return whole if 2 * pair >= len(pads) else self.node("sum", whole, pads[2 * pair], pads[2 * pair + 1])

    def _numbers(self, value: torch._C.Value, depth: int) -> list[int]:
        """The nodes of an ``int[]`` argument: a list the trace builds from numbers, or a constant one."""
        if value.node().kind() == "prim::ListConstruct":
            return [self.number(element, depth) for element in value.node().inputs()]
        constant = _constant(value)
        if not isinstance(constant, (list, tuple)):
            raise Unknown
        return [self._const(element) for element in constant]

    def _known(self, value: torch._C.Value, dim: int) -> int:
        sizes = value.type().sizes()
        if sizes is None or sizes[dim] is None:
            raise Unknown
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
