"""``tensor_split`` into a number of parts, traced as slices of the tensor.

torch exports ``x.tensor_split(n, dim)`` as an ONNX sequence (``SplitToSequence``, each part taken
with ``SequenceAt``). ORT has no gradient for sequences and leaves those edges out of its gradient
graph without a word: with another path from the same parameters to the loss, training was silently
wrong (an embedding's weights 0.08 off after three steps, no warning), with none the module fell
back to PyTorch, and with a layer between the split and the loss ORT's backward failed. While the
export traces, the call is replaced by the slices torch's parts are, their bounds computed in the
graph from the tensor's shape (``size // n`` positions each, one more for the first ``size % n``), so
ORT differentiates them and a dimension of any size is split as torch splits it.
"""

from __future__ import annotations

from typing import Any

import torch

Call = tuple[Any, tuple[Any, ...], dict[str, Any]]  # a function, its positional and keyword arguments


def traced_form(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    """The call to trace in place of ``func(*args, **kwargs)``: the slices of a ``tensor_split`` into a
    number of parts or at Python indices (a tensor of indices keeps torch's own)."""
    if getattr(func, "__name__", None) != "tensor_split" or not args or not isinstance(args[0], torch.Tensor):
        return func, args, kwargs
    split = args[1] if len(args) > 1 else kwargs.get("sections", kwargs.get("indices"))
    dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
    if type(dim) is not int or not -args[0].dim() <= dim < args[0].dim():
        return func, args, kwargs
    if type(split) is int and split >= 1:
        return _sections, (args[0], split, dim % args[0].dim()), {}
    if isinstance(split, list | tuple) and all(type(index) is int for index in split):
        return _at_indices, (args[0], list(split), dim % args[0].dim()), {}
    return func, args, kwargs


def _sections(tensor: torch.Tensor, sections: int, dim: int) -> tuple[torch.Tensor, ...]:
    size = torch._shape_as_tensor(tensor)[dim]
    base, longer = torch.div(size, sections, rounding_mode="floor"), size % sections
    return _parts(tensor, dim, [base * part + longer.clamp(max=part) for part in range(1, sections)])


def _at_indices(tensor: torch.Tensor, indices: list[int], dim: int) -> tuple[torch.Tensor, ...]:
    return _parts(tensor, dim, indices)


def _parts(tensor: torch.Tensor, dim: int, inner: list[Any]) -> tuple[torch.Tensor, ...]:
    """``tensor[:b1], tensor[b1:b2], ..., tensor[bk:]`` along ``dim`` for the ``inner`` bounds ``b1 ... bk``."""
    bounds, lead = [None, *inner, None], (slice(None),) * dim
    return tuple(tensor[(*lead, slice(start, end))] for start, end in zip(bounds, bounds[1:], strict=False))
