"""Reflect and replicate padding and pixel (un)shuffle on torch's kernels inside ORT's graph.

ORT 1.19.2 has no gradient for ``Pad`` in ``reflect`` or ``edge`` mode, nor for ``DepthToSpace``
(``F.pixel_shuffle``), so models with them (image-to-image networks, super-resolution) could not
train in ORT and fell back to PyTorch. These are exported as ATen nodes running torch's own
operators, whose gradients are torch's too (``reflection_pad2d_backward``, ``pixel_unshuffle``, ...),
whatever ``op_rewrites`` says. Constant and circular padding stay ONNX ops, which ORT differentiates.
"""

from __future__ import annotations

from typing import Any

from torch.onnx._internal.torchscript_exporter import symbolic_helper, symbolic_opset11

from lightning_ort.engine.ops.kernels.gradient_overloads import register_simple_gradient
from lightning_ort.engine.ops.kernels.torch_kernels import aten_like

_PADS = {"reflect": "reflection_pad", "replicate": "replication_pad"}


def _pad(g: Any, input: Any, pad: Any, mode: Any, value: Any) -> Any:
    mode_name = symbolic_helper._maybe_get_const(mode, "s")
    sizes = symbolic_helper._maybe_get_const(pad, "is")
    if mode_name not in _PADS or symbolic_helper._is_value(sizes) or len(sizes) not in (2, 4, 6):
        return symbolic_opset11.pad(g, input, pad, mode, value)
    operator = f"{_PADS[mode_name]}{len(sizes) // 2}d"
    return aten_like(g, operator, input, pad, same_sizes=False)


def _shuffle(operator: str) -> Any:
    def symbolic(g: Any, input: Any, factor: Any) -> Any:
        return aten_like(g, operator, input, factor, same_sizes=False)

    return symbolic


def register() -> None:
    """Register the symbolics and gradients with ORT's registries (process-wide)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("pad", "", _pad)
    for operator, inverse in (("pixel_shuffle", "pixel_unshuffle"), ("pixel_unshuffle", "pixel_shuffle")):
        CustomOpSymbolicRegistry.register(operator, "", _shuffle(operator))
        register_simple_gradient(operator, inverse, ["GO(0)", "I(1)"])
    for kind in _PADS.values():
        for dims in (1, 2, 3):
            register_simple_gradient(f"{kind}{dims}d", f"{kind}{dims}d_backward", ["GO(0)", "I(0)", "I(1)"])
