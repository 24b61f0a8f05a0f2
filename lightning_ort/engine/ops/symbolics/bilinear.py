"""``nn.Bilinear`` (``F.bilinear``), traced as matrix products.

torch has no ONNX export for ``aten::bilinear``, so every module with an ``nn.Bilinear`` fell back to
PyTorch. While the export traces, the call is replaced by ``x1 @ weight @ x2`` over each output
feature (plus the bias), which ORT differentiates.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_ort.engine.ops.symbolics.tensor_splits import Call

_ARGUMENTS = ("input1", "input2", "weight", "bias")


def traced_form(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    """The call to trace in place of ``func(*args, **kwargs)``: products for ``bilinear``."""
    if getattr(func, "__name__", None) != "bilinear":
        return func, args, kwargs
    named = dict(zip(_ARGUMENTS, args, strict=False)) | kwargs
    if set(named) - set(_ARGUMENTS) or not all(isinstance(named.get(name), torch.Tensor) for name in _ARGUMENTS[:3]):
        return func, args, kwargs
    return _products, (named["input1"], named["input2"], named["weight"], named.get("bias")), {}


def _products(x1: torch.Tensor, x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # (..., 1, 1, in1) @ (out, in1, in2) @ (..., 1, in2, 1) -> (..., out, 1, 1)
    output = (x1[..., None, None, :] @ weight @ x2[..., None, :, None]).squeeze(-1).squeeze(-1)
    return output if bias is None else output + bias
