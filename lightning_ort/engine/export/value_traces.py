"""The trace value of a tensor, read without breaking the trace.

``torch._C._get_value_trace`` inserts a tensor the open trace has not seen as a constant. For one that
requires grad (a parameter of another module reached through a closure, one kept in a list attribute)
it raises, and leaves torch's tracer broken: the process died (SIGSEGV) when the trace ended, where
torch's own export fails with "Cannot insert a Tensor that requires grad as a constant". The export
runs with gradients off, so the only leaves that require grad and that the trace holds are the
parameters of the module being exported.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch

_PARAMETERS: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar("_PARAMETERS", default=frozenset())


@contextlib.contextmanager
def exporting(module: torch.nn.Module) -> Iterator[None]:
    """Within the block, :func:`value_trace` takes ``module``'s parameters as the traced ones."""
    token = _PARAMETERS.set(frozenset(id(parameter) for parameter in module.parameters()))
    try:
        yield
    finally:
        _PARAMETERS.reset(token)


def value_trace(tensor: torch.Tensor) -> torch._C.Value | None:
    """``tensor``'s value in the open trace; None for a tensor the trace cannot hold."""
    with torch._C.DisableTorchFunction():  # not a read of the user's code for traced_calls' mode
        outside = tensor.requires_grad and tensor.grad_fn is None and id(tensor) not in _PARAMETERS.get()
    if outside:
        return None
    try:
        return torch._C._get_value_trace(tensor)
    except RuntimeError:  # not part of the trace
        return None
