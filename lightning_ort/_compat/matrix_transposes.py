"""``Tensor.mT``, ``mH`` and ``adjoint()``, which torch 2.13 cannot export to ONNX.

They are the transpose of the last two dimensions (``mH`` and ``adjoint`` also conjugate, which
changes nothing for the real tensors ORT trains), so they are exported as ``transpose(-2, -1)``,
which ORT trains, and which op_rewrites' matmul takes as a view. Models using them (``q @ k.mT``)
fell back to PyTorch.
"""

from __future__ import annotations

from typing import Any

from torch.onnx._internal.torchscript_exporter import symbolic_opset9


def _last_two_swapped(g: Any, self: Any) -> Any:
    return symbolic_opset9.transpose(g, self, -2, -1)


def register() -> None:
    """Register the symbolics with ORT's registry (applied at each ORTModule creation)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    for name in ("mT", "mH", "adjoint"):
        CustomOpSymbolicRegistry.register(name, "", _last_two_swapped)
