"""Export forms and gradients for layers ORT 1.19.2 cannot train as torch exports them.

- ``nn.RMSNorm`` / ``F.rms_norm``: torch's TorchScript exporter has no symbolic for it, so a model
  with one could not be exported and fell back to PyTorch. It is exported as torch computes it
  (``x * rsqrt(mean(x**2) + eps)`` in float32 or float64, then cast back and scaled by the
  weight), in ONNX ops ORT differentiates, also with sizes read from the input (``F.rms_norm(x,
  x.shape[-1:])``, modded-nanoGPT's form).
- ``torch.where`` with an operand that broadcasts: ORT's gradient of ``Where`` passes the output's
  gradient on to it unreduced (``torch.where(mask, h, torch.tanh(v))`` with ``v`` of shape (C,) got a
  (B, T, C) gradient, which the next gradient nodes broadcast further: silently wrong training; ORT
  only warned "Error merging shape info"). Each tensor operand is expanded to the output's shape
  first; ``Expand``'s gradient sums it back, as eager does.
- ``cumsum``: ORT has no gradient for ``CumSum``; it is the reverse cumulative sum of the output's
  gradient, given here (torch exports ``CumSum`` with ORT's defaults, forward and exclusive off).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import _type_utils, symbolic_helper, symbolic_opset9

_HALF = (torch.float16, torch.bfloat16)


def normalized_dims(normalized_shape: Any) -> int:
    """How many trailing dimensions a norm's ``normalized_shape`` covers, also when its sizes are read from
    the input (``F.rms_norm(x, x.shape[-1:])``, ``F.layer_norm(x, (x.size(-1),))``)."""
    if symbolic_helper._is_packed_list(normalized_shape):
        return len(symbolic_helper._unpack_list(normalized_shape))
    return len(symbolic_helper._get_const(normalized_shape, "is", "normalized_shape"))


def _rms_norm(g: Any, input: Any, normalized_shape: Any, weight: Any, eps: Any) -> Any:
    dims = normalized_dims(normalized_shape)
    dtype = _type_utils.JitScalarType.from_value(input, _type_utils.JitScalarType.FLOAT).dtype()
    compute = torch.float32 if dtype in _HALF else dtype  # torch's opmath type
    if symbolic_helper._is_none(eps):
        eps_value = torch.finfo(compute).eps
    else:
        eps_value = float(symbolic_helper._get_const(eps, "f", "eps"))
    x = input
    if compute != dtype:
        x = g.op("Cast", input, to_i=_type_utils.JitScalarType.from_dtype(compute).onnx_type())
    mean = g.op(
        "ReduceMean",
        g.op("Pow", x, g.op("Constant", value_t=torch.tensor(2.0, dtype=compute))),
        axes_i=list(range(-dims, 0)),
        keepdims_i=1,
    )
    added = g.op("Add", mean, g.op("Constant", value_t=torch.tensor(eps_value, dtype=compute)))
    output = g.op("Mul", x, g.op("Reciprocal", g.op("Sqrt", added)))
    if compute != dtype:
        output = g.op("Cast", output, to_i=_type_utils.JitScalarType.from_dtype(dtype).onnx_type())
    if not symbolic_helper._is_none(weight):
        output = g.op("Mul", output, weight)
    return output


def full_where(g: Any, condition: Any, x: Any, y: Any) -> Any:
    """``Where(condition, x, y)`` with its tensor operands expanded to the output's shape."""
    return g.op("Where", condition, *(_broadcast_to_all(g, value, (condition, x, y)) for value in (x, y)))


def _broadcast_to_all(g: Any, value: Any, operands: tuple[Any, ...]) -> Any:
    if symbolic_helper._is_constant(value):  # a number: no gradient
        return value
    for other in operands:  # ONNX's Expand broadcasts both ways
        if other is not value:
            value = g.op("Expand", value, g.op("Shape", other))
    return value


def _where(g: Any, condition: Any, self: Any = None, other: Any = None, _outputs: Any = None) -> Any:
    if self is None or other is None:
        return symbolic_opset9.where(g, condition, self, other, _outputs)
    if not symbolic_helper._is_bool(condition):
        condition = g.op("Cast", condition, to_i=_type_utils.JitScalarType.BOOL.onnx_type())
    return full_where(g, condition, self, other)


def _cumsum_gradient() -> list[Any]:
    reverse = {"reverse": {"value": 1, "dtype": "int"}}
    return [("CumSum", ["GO(0)", "I(1)"], ["GI(0)"], reverse)]


def register() -> None:
    """Register the symbolic and the gradient with ORT's registries (process-wide)."""
    from onnxruntime.training.ortmodule._custom_gradient_registry import CustomGradientRegistry
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("rms_norm", "", _rms_norm)
    CustomOpSymbolicRegistry.register("where", "", _where)
    CustomGradientRegistry.register("", "CumSum", (), _cumsum_gradient)
