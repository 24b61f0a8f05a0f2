"""``padding="same"`` / ``"valid"`` convolutions exported with explicit padding.

torch's exporter emits ``Conv(auto_pad="SAME_UPPER")`` for ``padding="same"``. ORT 1.19.2's
``ConvGrad`` computes wrong gradients for it where the padding is asymmetric (even kernel sizes:
torch pads one more on the end) and its ``Conv`` rejects it with dilation. lightning_ort exports
such a convolution as a zero ``Pad`` of the extra end padding, if any, followed by a convolution
with symmetric numeric padding, which ORT (and op_rewrites' torch kernels) train exactly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import symbolic_helper


def explicit_padding(g: Any, input: Any, weight: Any, stride: Any, padding: Any, dilation: Any) -> Any:
    """``(input, strides, pads, dilations)`` with the padding made explicit, or None if unknown."""
    mode = symbolic_helper._maybe_get_const(padding, "s")
    strides = symbolic_helper._maybe_get_const(stride, "is")
    dilations = symbolic_helper._maybe_get_const(dilation, "is")
    kernel = (symbolic_helper._get_tensor_sizes(weight) or [])[2:]
    if mode not in ("same", "valid") or not isinstance(strides, list) or not isinstance(dilations, list):
        return None
    if not kernel or None in kernel:
        return None
    strides = strides * len(kernel) if len(strides) == 1 else strides
    dilations = dilations * len(kernel) if len(dilations) == 1 else dilations
    if mode == "valid":
        return input, strides, [0] * len(kernel), dilations
    totals = [d * (k - 1) for d, k in zip(dilations, kernel, strict=True)]
    begins = [total // 2 for total in totals]
    extra = [total - begin - begin for total, begin in zip(totals, begins, strict=True)]
    if any(extra):
        pads = [0, 0] + [0] * len(kernel) + [0, 0] + extra  # ONNX Pad: all begins, then all ends
        input = g.op("Pad", input, g.op("Constant", value_t=torch.tensor(pads, dtype=torch.int64)), mode_s="constant")
    return input, strides, begins, dilations


def convolution_mode_symbolic(
    g: Any, input: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any, groups: Any
) -> Any:
    # ORT's own rules for both forms (they add bf16 casts around torch's)
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import convolution, convolution_mode

    plan = explicit_padding(g, input, weight, stride, padding, dilation)
    if plan is None:
        return convolution_mode(g, input, weight, bias, stride, padding, dilation, groups)
    input, strides, pads, dilations = plan
    groups_value = symbolic_helper._maybe_get_const(groups, "i")
    zeros = [0] * len(pads)
    return convolution(
        g, input, weight, bias, strides, pads, dilations, False, zeros, groups_value, None, None, None, None
    )


def register() -> None:
    """Replace ORT's ``_convolution_mode`` export rule (applied at each ORTModule creation)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("_convolution_mode", "", convolution_mode_symbolic)
