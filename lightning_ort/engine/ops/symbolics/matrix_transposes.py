"""Transposes torch 2.13 exports to ONNX wrongly or not at all.

- ``Tensor.mT``, ``mH`` and ``adjoint()`` cannot be exported. They are the transpose of the last two
  dimensions (``mH`` and ``adjoint`` also conjugate, which changes nothing for the real tensors ORT
  trains), so they are exported as ``transpose(-2, -1)``, which ORT trains, and which op_rewrites'
  matmul takes as a view. Models using them (``q @ k.mT``) fell back to PyTorch.
- ``permute`` and ``movedim`` (``moveaxis``) given a negative dimension (``h.permute(0, -1, 1)``,
  ``h.movedim(-1, 1)``) were exported with that number in ``Transpose``'s ``perm``, which ORT
  rejects when it builds the graph, so such models fell back. The dimensions are counted from the
  front first.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import symbolic_helper, symbolic_opset9


def _last_two_swapped(g: Any, self: Any) -> Any:
    return symbolic_opset9.transpose(g, self, -2, -1)


def _counted_from_front(self: Any, dims: Any) -> list[int] | None:
    """``dims`` (a constant int or list of them) counted from the front of ``self``'s dimensions, if known."""
    rank = symbolic_helper._get_tensor_rank(self)
    values = symbolic_helper._maybe_get_const(dims, "is" if symbolic_helper._is_packed_list(dims) else "t")
    if rank is None or symbolic_helper._is_value(values):
        return None
    return [dim % rank for dim in torch.as_tensor(values).reshape(-1).tolist()]


def _permute(g: Any, self: Any, dims: Any) -> Any:
    perm = _counted_from_front(self, dims)
    return symbolic_opset9.permute(g, self, dims if perm is None else perm)


def _movedim(g: Any, self: Any, source: Any, destination: Any) -> Any:
    sources, destinations = _counted_from_front(self, source), _counted_from_front(self, destination)
    if sources is None or destinations is None or len(sources) != len(destinations):
        return symbolic_opset9.movedim(g, self, source, destination)
    rank = symbolic_helper._get_tensor_rank(self)
    perm: list[int | None] = [None] * rank
    for src, dst in zip(sources, destinations, strict=True):
        perm[dst] = src
    rest = iter(dim for dim in range(rank) if dim not in sources)
    order = [dim if dim is not None else next(rest) for dim in perm]
    return self if order == list(range(rank)) else g.op("Transpose", self, perm_i=order)


def register() -> None:
    """Register the symbolics with ORT's registry (applied at each ORTModule creation)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    for name in ("mT", "mH", "adjoint"):
        CustomOpSymbolicRegistry.register(name, "", _last_two_swapped)
    CustomOpSymbolicRegistry.register("permute", "", _permute)
    CustomOpSymbolicRegistry.register("movedim", "", _movedim)
