"""Which dimensions of a traced tensor have a size no input's size can change.

The export's checks (``traced_numbers.py``, ``traced_calls.py``) allow Python to read a size, iterate
over a dimension or count the parts of a split only where the number cannot differ from batch to
batch: a constant in a ``reshape``/``view``, a ``Linear`` layer's features, the count of a ``stack``.
Anything this module does not follow counts as varying.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_SAME_SHAPE = frozenset(
    f"aten::{name}"
    for name in (
        "contiguous", "clone", "detach", "to", "type_as", "dropout", "relu", "gelu", "silu", "tanh", "sigmoid",
        "softmax", "log_softmax", "layer_norm",
    )
)  # fmt: skip
_MAX_DEPTH = 64
# Answers of the query in progress, by trace value and dimension (-1 for a number), each with the depth it
# was reached at: the recursion meets the same value on many paths (each residual add doubles them), and
# without this a query's time grew as 2 ** blocks (a 12-block ViT took minutes per call).
_MEMO: dict[tuple[int, int], tuple[bool, int]] | None = None


def _remembered(value: torch._C.Value, dim: int, depth: int, answer: Callable[[], bool]) -> bool:
    """``answer()`` for ``value``'s dimension ``dim`` reached at ``depth``, once per query where it can be.

    True holds at any depth; False reached at depth ``d`` holds at any depth ``>= d`` (less of the
    budget is left there), so the result is the plain recursion's; a False from deeper down is computed
    again, at most ``_MAX_DEPTH`` times per value, which keeps a query linear in the size of the trace.
    The memo lives for the outermost query only: the open trace grows between queries."""
    global _MEMO
    outermost = _MEMO is None
    if outermost:
        _MEMO = {}
    try:
        key = (value.unique(), dim)
        known = _MEMO.get(key)
        if known is not None and (known[0] or known[1] <= depth):
            return known[0]
        result = answer()
        _MEMO[key] = (result, depth)
        return result
    finally:
        if outermost:
            _MEMO = None


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


def fixed_size(value: torch._C.Value, dim: int, depth: int = 0) -> bool:
    """Whether dimension ``dim`` of the traced ``value`` has a size no input's size can change: a
    constant (or arithmetic of constants and fixed sizes, ``C // n_head``) in a ``reshape``/``view``,
    moved by ``permute``/``transpose``, the count of a ``stack``, a ``Linear`` layer's features, an
    embedding's width, kept by element-wise ops and broadcasts. Anything this does not follow counts
    as varying."""
    return _remembered(value, dim, depth, lambda: _fixed_size(value, dim, depth))


def _fixed_size(value: torch._C.Value, dim: int, depth: int) -> bool:
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
        return fixed_size(inputs[0], dim, depth + 1)
    if kind in ("aten::reshape", "aten::view"):
        sizes = list(inputs[1].node().inputs()) if inputs[1].node().kind() == "prim::ListConstruct" else None
        if sizes is None:
            constants = _constant_ints(inputs[1])
            return constants is not None and constants[dim] >= 0
        size = _constant_int(sizes[dim])
        if size == -1:
            return _fixed_inferred_size(inputs[0], sizes, dim, depth)
        return size >= 0 if size is not None else fixed_number(sizes[dim], depth + 1)
    if kind == "aten::embedding":  # (weight, indices, ...): the last dimension is the weight's width
        return dim == rank - 1 or fixed_size(inputs[1], dim, depth + 1)
    if kind in _BROADCASTING:
        return _fixed_broadcast(value, [tensor for tensor in inputs if isinstance(tensor.type(), torch._C.TensorType)],
                                dim, depth)  # fmt: skip
    if kind == "aten::permute":
        order = _constant_ints(inputs[1])
        return order is not None and fixed_size(inputs[0], order[dim], depth + 1)
    if kind == "aten::transpose":
        first, second = _constant_int(inputs[1]), _constant_int(inputs[2])
        if first is None or second is None:
            return False
        swap = {first % rank: second % rank, second % rank: first % rank}
        return fixed_size(inputs[0], swap.get(dim, dim), depth + 1)
    if kind == "aten::unsqueeze":
        position = _constant_int(inputs[1])
        if position is None:
            return False
        position %= rank
        return dim == position or fixed_size(inputs[0], dim - (dim > position), depth + 1)
    if kind == "aten::stack":
        position = _constant_int(inputs[1])
        return position is not None and dim == position % rank and inputs[0].node().kind() == "prim::ListConstruct"
    if kind == "aten::repeat":  # (x, repeats): dimension d is x's (aligned to the right) times repeats[d]
        node_sizes = inputs[1].node()
        times = list(node_sizes.inputs())[dim] if node_sizes.kind() == "prim::ListConstruct" else None
        source_rank = inputs[0].type().dim() if isinstance(inputs[0].type(), torch._C.TensorType) else None
        if times is None or source_rank is None or not fixed_number(times, depth + 1):
            return False
        source_dim = dim - (rank - source_rank)
        return source_dim < 0 or fixed_size(inputs[0], source_dim, depth + 1)
    if kind == "aten::linear":
        return dim == rank - 1 or fixed_size(inputs[0], dim, depth + 1)
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


def fixed_number(value: torch._C.Value, depth: int = 0) -> bool:
    """Whether a traced number (an int or a 0-d tensor) is computed from constants and fixed sizes only."""
    return _remembered(value, -1, depth, lambda: _fixed_number(value, depth))


def _fixed_number(value: torch._C.Value, depth: int) -> bool:
    if depth > _MAX_DEPTH:
        return False
    node = value.node()
    if node.kind() == "prim::Constant":
        return True
    if node.kind() == "aten::size":
        return is_fixed_size_node(node, depth)
    return node.kind() in _NUMBER_OPS and all(fixed_number(operand, depth + 1) for operand in node.inputs())


def is_fixed_size_node(node: torch._C.Node, depth: int = 0) -> bool:
    """Whether the trace's ``aten::size(x, d)`` node reads a dimension :func:`_fixed_size` shows constant."""
    source, index = list(node.inputs())
    dim = _constant_int(index)
    return dim is not None and fixed_size(source, dim, depth + 1)


def _read_size(value: torch._C.Value) -> tuple[torch._C.Value, int] | None:
    """``(x, d)`` when the traced number ``value`` is ``x.size(d)`` (through the trace's number wrappers)."""
    node = value.node()
    while node.kind() in ("aten::Int", "aten::ScalarImplicit", "prim::NumToTensor"):
        node = next(iter(node.inputs())).node()
    if node.kind() != "aten::size" or len(list(node.inputs())) != 2:
        return None
    source, index = node.inputs()
    dim = _constant_int(index)
    rank = source.type().dim() if isinstance(source.type(), torch._C.TensorType) else None
    return None if dim is None or rank is None else (source, dim % rank)


def _fixed_inferred_size(source: torch._C.Value, sizes: list[torch._C.Value], dim: int, depth: int) -> bool:
    """Whether the ``-1`` at ``dim`` of ``source.view(sizes)`` is a fixed size: it is ``source``'s element count
    over the other sizes, which is fixed when each of ``source``'s dimensions is fixed or given again among the
    other sizes as ``source.size(d)`` (``x.view(x.size(0), x.size(1), heads, -1)``), and every other size left
    is fixed."""
    rank = source.type().dim() if isinstance(source.type(), torch._C.TensorType) else None
    if rank is None:
        return False
    repeated: set[int] = set()
    for position, size in enumerate(sizes):
        if position == dim:
            continue
        read = _read_size(size)
        if read is not None and read[0].unique() == source.unique() and read[1] not in repeated:
            repeated.add(read[1])
        elif not fixed_number(size, depth + 1):
            return False
    return all(d in repeated or fixed_size(source, d, depth + 1) for d in range(rank))


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
        aligned.append((fixed_size(tensor, index, depth + 1), sizes[index] if sizes is not None else None))
    return bool(aligned) and (all(fixed for fixed, _ in aligned) or any(fixed and size != 1 for fixed, size in aligned))
