"""``Tensor.detach()`` as a gradient stop inside ORT graphs.

torch's TorchScript exporter erases ``aten::detach`` (ONNX graphs are inference-only), so ORT's
gradient builder would differentiate straight through it: ``x + (q - x).detach()`` (the
straight-through trick), target networks and stop-gradients would silently get other gradients
than in PyTorch. We export ``detach`` as torch's ``detach_copy`` run by ORT's ATen executor and
tell ORT's gradient builder that no gradient flows into it.
"""

from __future__ import annotations

from typing import Any

from lightning_ort.engine.ops.kernels.torch_kernels import ATEN


def detach_symbolic(g: Any, input: Any) -> Any:
    return g.op(ATEN, input, operator_s="detach_copy")


def register() -> None:
    """Register the symbolic and the stop-gradient edge with ORT's registries."""
    from onnxruntime.training.ortmodule._custom_gradient_registry import CustomGradientRegistry
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("detach", "", detach_symbolic)
    CustomGradientRegistry.register_custom_stop_gradient_edges([0], "org.pytorch.aten", "ATen", "detach_copy", "")
