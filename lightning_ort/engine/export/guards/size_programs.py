"""Size programs: the computations a size guard (``size_guards.py``) or a value guard (``value_guards.py``)
checks before each call, as nodes over the inputs' sizes and values, and running them on a call's inputs.

A program is built while the export traces (``traced_sizes.py``, ``value_guards.py``), pruned to what its
decisions read (:func:`program`), kept with the graph (and with a cached export), and run by
:func:`evaluate` before each call of that graph.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# A node of a size program: ("const", number) | ("size", argument name, leaf index, dim) | (operator, *operand
# nodes' positions); a program lists its nodes operands first, so it runs in one pass
Node = tuple[Any, ...]

BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "floordiv": operator.floordiv, "floor_divide": operator.floordiv, "remainder": operator.mod,
    "gt": operator.gt, "lt": operator.lt, "ge": operator.ge, "le": operator.le, "eq": operator.eq, "ne": operator.ne,
    "__and__": operator.and_, "__or__": operator.or_, "bitwise_and": operator.and_, "bitwise_or": operator.or_,
    "logical_and": lambda a, b: bool(a) and bool(b), "logical_or": lambda a, b: bool(a) or bool(b),
    "maximum": max, "minimum": min, "max": max, "min": min, "pow": operator.pow,
}  # fmt: skip
UNARY: dict[str, Callable[[Any], Any]] = {
    "neg": operator.neg, "abs": abs, "logical_not": operator.not_, "bitwise_not": lambda a: not a if isinstance(
        a, bool) else ~a,
}  # fmt: skip


@dataclass(frozen=True)
class SizeDecision:
    """One Python branch on sizes: the node of its program that computes it from the inputs' sizes, the
    answer the export took, and where it branched."""

    expression: int
    answer: Any
    location: str


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
            values.append(_value_node(kind, operands[:metadata], [values[o] for o in operands[metadata:]]))
        else:
            values.append(_apply(kind, [values[operand] for operand in operands]))
    return values


def _apply(kind: str, values: list[Any]) -> Any:
    if kind in BINARY:
        return BINARY[kind](*values)
    if kind in UNARY:
        return UNARY[kind](*values)
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


def program(nodes: list[Node], decisions: list[SizeDecision]) -> tuple[list[Node], list[SizeDecision]]:
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


def _value_node(kind: str, operands: list[Any], values: list[Any]) -> Any:
    """The value of an ``("aten", ...)`` or ``("list", ...)`` node, given its operands' ``values``."""
    if kind == "list":
        return list(values)
    name, overload, spec = operands[:3]
    args, kwargs = [], {}
    for (keyword, tensor), value in zip(spec, values, strict=True):
        if tensor and not isinstance(value, torch.Tensor):
            value = torch.tensor(value)
        if keyword:
            kwargs[keyword] = value
        else:
            args.append(value)
    return getattr(getattr(torch.ops.aten, name), overload or "default")(*args, **kwargs)
