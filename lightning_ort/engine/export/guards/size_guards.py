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
operators ``traced_sizes.py`` knows; a branch on values computed from the inputs alone (``mask.all()``) is
kept the same way, its computation followed by ``value_guards.py``; anything else (a size after a
data-dependent operator such as ``nonzero``, a value read through a parameter) stays refused by the
export's checks with the line that branched.

This module keeps the decisions (recorded during the export, checked before each call, kept with a cached
export); ``traced_sizes.py`` follows a traced number back to the inputs' sizes, and ``size_programs.py``
holds the programs both write and runs them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree

from lightning_ort.engine.export.guards import size_programs, value_guards
from lightning_ort.engine.export.guards.size_programs import Node, SizeDecision, evaluate
from lightning_ort.engine.export.guards.traced_sizes import SizeFollower, Unknown
from lightning_ort.engine.export.tracing_state import untraced, warned_at_caller
from lightning_ort.engine.export.value_traces import value_trace

log = logging.getLogger(__name__)

_GUARDS: weakref.WeakKeyDictionary[torch.nn.Module, SizeGuards] = weakref.WeakKeyDictionary()


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


# --- recording during the export, checking before each call ----------------------------------------------


@dataclass
class _Recording:
    """What the export in progress found: the size program and its decisions."""

    follower: SizeFollower
    decisions: list[SizeDecision] = field(default_factory=list)


@contextlib.contextmanager
def recorded_decisions(adapter: torch.nn.Module, locate: Callable[[], str | None]) -> Iterator[_Recording]:
    """While the export traces ``adapter``'s forward, answer ``bool()`` of a traced size decision (a
    comparison of sizes computed from the inputs' sizes) without torch's TracerWarning, and record it.
    Other conversions are left to torch, and the export's checks refuse them as before. The decisions
    become the graph's guards when the export succeeds (:func:`keep_decisions`)."""
    inputs: dict[int, tuple[str, int]] = {}
    recording = _Recording(SizeFollower(inputs))
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
        if not torch.jit.is_tracing():
            return original(self)
        if self.dim() != 0 or not inputs:  # not a number the guards follow: torch warns at the caller's line
            return warned_at_caller(original, self)
        value = value_trace(self)
        try:
            expression = follower.number(value) if value is not None else None
        except (Unknown, RecursionError, RuntimeError, TypeError, AttributeError, IndexError, KeyError) as error:
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


def _on_input_values(
    follower: SizeFollower, value: torch._C.Value | None, locate: Callable[[], str | None]
) -> int | None:
    """The node computing a branch's value from the inputs' values and sizes, or None (value_guards.py)."""
    if value is None:
        return None
    try:
        return value_guards.follow(follower, value)
    except (value_guards.NotAnInputValue, Unknown, RecursionError, RuntimeError, TypeError, AttributeError,
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
    program, _ = size_programs.program(nodes, [SizeDecision(position, None, "")])
    read = [node[1:3] for node in program if node[0] == "input"]
    return all(isinstance(leaves.get(tuple(where)), torch.Tensor) for where in read)


def _caller() -> str:
    frame = sys._getframe(2)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _reads_a_size(nodes: list[Node], position: int) -> bool:
    """Whether the node reads an input's size or value (else it is a constant, which needs no guard)."""
    program, _ = size_programs.program(nodes, [SizeDecision(position, None, "")])
    return any(node[0] in ("size", "input") for node in program)


def keep_decisions(adapter: torch.nn.Module, recording: _Recording, traced: bool) -> None:
    """After a successful export for the graph the guard is calling: its decisions (those of the cached
    export, when it ``traced`` nothing) are that graph's guards."""
    guards = guards_of(adapter)
    found = size_programs.program(recording.follower.nodes, recording.decisions) if traced else guards.restored
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
            program, _ = size_programs.program(nodes, [decision])
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
