"""The trace value of a tensor, read without breaking the trace.

``torch._C._get_value_trace`` inserts a tensor the open trace has not seen as a constant. For one that
requires grad (a parameter of another module reached through a closure, one kept in a list attribute)
it raises, and leaves torch's tracer broken: the process died (SIGSEGV) when the trace ended, where
torch's own export fails with "Cannot insert a Tensor that requires grad as a constant". The export
runs with gradients off, so the only leaves that require grad and that the trace holds are the
parameters of the module being exported and the inputs of its traced call: ORT exports with leaf copies
of the call's inputs, an input that requires grad (a head's features computed by a backbone in PyTorch)
among them. Left out, such an input's sizes were unknown to the size guards, and torch's own validation
of it (BatchNorm's batch-size check, an RNN's ``check_input``) was refused as a branch on data.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree


@dataclass
class _Traced:
    """The leaves that require grad which the open trace holds: the exported module's parameters (by id),
    and the tensor inputs of its traced call (kept, so that their ids stay theirs)."""

    parameters: frozenset[int] = frozenset()
    inputs: dict[int, torch.Tensor] = field(default_factory=dict)

    def holds(self, tensor: torch.Tensor) -> bool:
        return id(tensor) in self.parameters or self.inputs.get(id(tensor)) is tensor


_TRACED: contextvars.ContextVar[_Traced | None] = contextvars.ContextVar("_TRACED", default=None)


@contextlib.contextmanager
def exporting(module: torch.nn.Module) -> Iterator[None]:
    """Within the block, :func:`value_trace` takes ``module``'s parameters, and the tensors its traced call
    gets, as the traced ones (``module`` is the one torch's exporter traces: ORT's flattened module)."""
    traced = _Traced(frozenset(id(parameter) for parameter in module.parameters()))

    def note_inputs(traced_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not torch.jit.is_tracing():
            return
        traced.inputs = {
            id(leaf): leaf for leaf in _pytree.tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)
        }

    handle = module.register_forward_pre_hook(note_inputs, with_kwargs=True)
    token = _TRACED.set(traced)
    try:
        yield
    finally:
        _TRACED.reset(token)
        handle.remove()


def value_trace(tensor: torch.Tensor) -> torch._C.Value | None:
    """``tensor``'s value in the open trace; None for a tensor the trace cannot hold."""
    with torch._C.DisableTorchFunction():  # not a read of the user's code for traced_calls' mode
        traced = _TRACED.get()
        outside = tensor.requires_grad and tensor.grad_fn is None and (traced is None or not traced.holds(tensor))
    if outside:
        return None
    try:
        return torch._C._get_value_trace(tensor)
    except RuntimeError:  # not part of the trace
        return None
