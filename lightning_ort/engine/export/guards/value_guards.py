"""Python branches on the *values* of ``forward``'s inputs, kept as guards checked before every call.

``if attention_mask.all():``, ``if (mask.sum() == mask.numel())``: the export traces one branch, and the
graph holds it only. When the branch's value is a function of the graph's inputs alone (no parameter, no
buffer, nothing random), :mod:`size_guards` keeps it as a guard like a branch on sizes: this module follows
the trace back from the branch's 0-d tensor to the inputs, through the pure tensor operators of
:data:`_OPERATORS`, and writes the computation into the size program as nodes that
:func:`size_programs.evaluate` runs on each call's inputs (a few small tensor operations on the mask, not the
model). When the answer differs from the export's, ORT exports again (bounded with the size guards).

Anything else on the way (a parameter, a buffer, an operator not listed, a tensor constant) stays refused
by the export's checks: a guard that could miss a flip would train silently wrong.
"""

from __future__ import annotations

import torch

from lightning_ort.engine.export.guards.traced_sizes import SizeFollower

# Deterministic operators without state whose result depends on their operands only
_OPERATORS = frozenset(
    f"aten::{name}"
    for name in (
        "sum", "all", "any", "eq", "ne", "lt", "gt", "le", "ge", "logical_not", "bitwise_not", "__and__", "__or__",
        "__xor__", "bitwise_and", "bitwise_or", "bitwise_xor", "logical_and", "logical_or", "logical_xor", "to",
        "type_as", "slice", "select", "index_select", "amin", "amax", "min", "max", "abs", "neg", "add", "sub", "mul",
        "rsub", "count_nonzero", "contiguous", "clone", "detach", "unsqueeze", "squeeze", "float", "long", "int",
        "bool", "alias", "lift_fresh", "flatten", "prod", "isnan", "isinf", "isfinite",
    )
)  # fmt: skip
_PASSING = frozenset({"prim::NumToTensor", "aten::Int", "aten::Bool", "aten::Float", "aten::ScalarImplicit"})


class NotAnInputValue(Exception):
    """The branch's value depends on something other than the inputs (its message: what)."""


def follow(follower: SizeFollower, value: torch._C.Value, depth: int = 0) -> int:
    """The position in ``follower``'s program of the node computing
    ``value`` from the inputs' sizes and values.

    Raises:
        NotAnInputValue: ``value`` depends on a parameter, a buffer, a tensor constant or an operator it does
            not follow.
    """
    if depth > 200:
        raise NotAnInputValue("a computation too deep to follow")
    try:
        return follower.number(value)  # sizes and numbers (mask.numel()) as size arithmetic
    except Exception:  # noqa: BLE001 - not sizes only: follow the values
        pass
    node = value.node()
    kind = node.kind()
    if kind == "prim::Param":
        position = follower.input_node(value)
        if position is None:
            raise NotAnInputValue("a parameter or buffer")
        return position
    if kind in _PASSING:
        return follow(follower, node.inputsAt(0), depth + 1)
    if kind not in _OPERATORS:
        raise NotAnInputValue(kind)
    schema = torch._C.parse_schema(node.schema())
    spec = []
    operands = []
    for argument, operand in zip(schema.arguments, node.inputs(), strict=False):
        tensor = isinstance(argument.type, torch._C.TensorType)
        spec.append(("" if not argument.kwarg_only else argument.name, tensor))
        operands.append(_operand(follower, operand, depth))
    return follower.node("aten", schema.name.partition("::")[2], schema.overload_name, tuple(spec), *operands)


def _operand(follower: SizeFollower, operand: torch._C.Value, depth: int) -> int:
    producer = operand.node()
    if producer.kind() == "prim::Constant":
        constant = operand.toIValue()
        if isinstance(constant, torch.Tensor):
            raise NotAnInputValue("a tensor constant")
        return follower.node("const", tuple(constant) if isinstance(constant, list) else constant)
    if producer.kind() == "prim::ListConstruct":
        return follower.node("list", *(_operand(follower, element, depth + 1) for element in producer.inputs()))
    return follow(follower, operand, depth + 1)
