"""Math functions ORT could not train, on torch's kernels inside ORT's graph.

torch 2.13 cannot export ``expm1``, ``trunc``, ``cumprod`` and ``logcumsumexp`` to ONNX, nor
``F.threshold`` with a threshold other than 0; ORT 1.19.2 has no gradient for ``Atan``, ``Sign``,
``Round``, ``Floor`` and ``Ceil``, and builds an invalid gradient graph for ``logsumexp`` without
``keepdim``. Models using them fell back to PyTorch. They are exported as ATen nodes running torch's
operators, with eager autograd's formulas as gradients (``csrc/math_ops.cc``; the gradient of
``trunc``, ``sign``, ``round``, ``floor`` and ``ceil`` is zero, as in eager), whatever
``op_rewrites`` says.

Silently wrong before: ORT 1.19.2 has no gradient for ``Pow``'s exponent and drops it, so a power
with a tensor exponent (``2.0 ** h``, GeM pooling's learnt ``p`` where ``p`` also reaches the loss
another way) trained without that term; such powers run torch's ``pow`` with eager's gradients.
``a // b`` and ``k >> n`` of negative integers rounded toward zero in torch's export, where eager
rounds down. ``clamp`` of an integer tensor with float bounds (``k.clamp(-1.5, 1.5)``, a float tensor
in eager) cast the bounds to integers in torch's export; the tensor is now cast to the result's type.
A cumulative sum of bools (``mask.cumsum(-1)``) and ``clamp`` with learnt bounds fell back to PyTorch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import _type_utils, symbolic_helper, symbolic_opset9, symbolic_opset11

from lightning_ort.engine.ops.kernels.gradient_overloads import (
    GRAD_DOMAIN,
    aten_node,
    register_gradient,
    register_simple_gradient,
)
from lightning_ort.engine.ops.kernels.torch_kernels import ATEN, aten_like, constant

_POW = "lightning_ort::pow"


def _unary(operator: str) -> Any:
    def symbolic(g: Any, self: Any) -> Any:
        return aten_like(g, operator, self)

    return symbolic


def _threshold(g: Any, self: Any, threshold: Any, value: Any) -> Any:
    limits = [symbolic_helper._maybe_get_const(argument, "f") for argument in (threshold, value)]
    if any(symbolic_helper._is_value(limit) for limit in limits):
        return symbolic_opset9.threshold(g, self, threshold, value)
    floats = [constant(g, float(limit), torch.float32) for limit in limits]
    return aten_like(g, "lightning_ort::threshold", self, *floats)


def _logsumexp(g: Any, input: Any, dim: Any, keepdim: Any) -> Any:
    dims = symbolic_helper._maybe_get_const(dim, "is")
    keep = symbolic_helper._maybe_get_const(keepdim, "b")
    rank = symbolic_helper._get_tensor_rank(input)
    if symbolic_helper._is_value(dims) or symbolic_helper._is_value(keep) or not dims or rank is None:
        return symbolic_opset9.logsumexp(g, input, dim, keepdim)
    keep_constant = constant(g, bool(keep))
    output = g.op(ATEN, input, constant(g, dims, torch.int64), keep_constant, operator_s="logsumexp")
    output.setType(input.type().with_sizes([None] * (rank if keep else rank - len(set(dims)))))
    return output


def _cumprod(g: Any, input: Any, dim: Any, dtype: Any) -> Any:
    if not symbolic_helper._is_none(dtype):  # torch casts the input first
        onnx_type = _type_utils.JitScalarType(symbolic_helper._get_const(dtype, "i", "dtype")).onnx_type()
        input = g.op("Cast", input, to_i=onnx_type)
    return aten_like(
        g, "lightning_ort::cumprod", input, constant(g, symbolic_helper._get_const(dim, "i", "dim"), torch.int64)
    )


def _logcumsumexp(g: Any, input: Any, dim: Any) -> Any:
    return aten_like(g, "logcumsumexp", input, constant(g, symbolic_helper._get_const(dim, "i", "dim"), torch.int64))


def _pow(g: Any, self: Any, exponent: Any) -> Any:
    """A tensor exponent (``2.0 ** h``, GeM pooling's learnt ``p``) on torch's kernel: ORT stops Pow's
    gradient at the exponent, silently. A constant exponent stays ORT's ``Pow``."""
    if symbolic_helper._is_constant(exponent) or not symbolic_helper._is_fp(exponent):
        return symbolic_opset9.pow(g, self, exponent)
    scalar_type = _type_utils.JitScalarType.from_value(exponent)
    if symbolic_helper._is_constant(self):  # a Python number as the base
        self = constant(g, float(symbolic_helper._maybe_get_const(self, "f")), scalar_type.dtype())
    elif _type_utils.JitScalarType.from_value(self, _type_utils.JitScalarType.UNDEFINED) != scalar_type:
        return symbolic_opset9.pow(g, self, exponent)
    ranks = [symbolic_helper._get_tensor_rank(value) for value in (self, exponent)]
    output = g.op(ATEN, self, exponent, operator_s=_POW)
    if None not in ranks:
        output.setType(exponent.type().with_sizes([None] * max(ranks)))  # type: ignore[type-var]
    return output


def _right_shift(g: Any, self: Any, other: Any) -> Any:
    """``k >> n`` of signed integers rounds down (-3 >> 1 is -2); torch's export divides, truncating."""
    scalar_type = _type_utils.JitScalarType.from_value(self, _type_utils.JitScalarType.UNDEFINED)
    if scalar_type not in (_type_utils.JitScalarType.INT64, _type_utils.JitScalarType.INT):
        return symbolic_opset11.__rshift_(g, self, other)
    exponent = g.op("Cast", other, to_i=_type_utils.JitScalarType.FLOAT.onnx_type())
    power = g.op("Pow", constant(g, 2.0, torch.float32), exponent)
    return symbolic_opset9._floor_divide(g, self, g.op("Cast", power, to_i=scalar_type.onnx_type()))


def _in_result_type(operator: str) -> Any:
    """torch's ``operator`` symbolic, given the tensor in the type of the traced result: the symbolic casts
    clamp's bounds to the tensor's type, where torch promotes an integer tensor to the bounds' float type,
    and ORT has no ``CumSum`` of bools (``mask.cumsum(-1)`` counts in int64 in eager). Bounds computed in
    the graph (a parameter: a learnt clipping threshold) are ``Max`` / ``Min`` nodes, which ORT
    differentiates for both operands; its ``Clip`` has no gradient for them."""
    torch_symbolic = getattr(symbolic_opset11, operator)

    def symbolic(g: Any, self: Any, *args: Any) -> Any:
        undefined = _type_utils.JitScalarType.UNDEFINED
        wanted = _type_utils.JitScalarType.from_value(g.original_node.output(), undefined)
        if wanted not in (undefined, _type_utils.JitScalarType.from_value(self, undefined)):
            self = g.op("Cast", self, to_i=wanted.onnx_type())
        if operator.startswith("clamp") and any(_computed(bound) for bound in args):
            lower, upper = {"clamp": args, "clamp_min": (args[0], None), "clamp_max": (None, args[0])}[operator]
            onnx_type = _type_utils.JitScalarType.from_value(self).onnx_type()
            for op_type, bound in (("Max", lower), ("Min", upper)):
                if bound is not None and not symbolic_helper._is_none(bound):
                    self = g.op(op_type, self, g.op("Cast", bound, to_i=onnx_type))
            return self
        return torch_symbolic(g, self, *args)

    return symbolic


# types ORT's CPU EyeLike has no kernel for
_NO_EYE = frozenset(
    getattr(_type_utils.JitScalarType, name) for name in ("BOOL", "INT8", "UINT8", "INT16", "HALF", "BFLOAT16")
)


def _eye(g: Any, *args: Any) -> Any:
    """``torch.eye(n, dtype=torch.bool)`` (a mask leaving out self-pairs) as a float ``EyeLike`` cast to its type:
    ORT's CPU build has no bool ``EyeLike``, and the module fell back."""
    wanted = _type_utils.JitScalarType.from_value(g.original_node.output(), _type_utils.JitScalarType.UNDEFINED)
    if wanted not in _NO_EYE or len(args) not in (5, 6):
        return symbolic_opset9.eye(g, *args)
    arguments = list(args)
    arguments[len(args) - 4] = constant(g, int(_type_utils.JitScalarType.FLOAT))  # dtype, before layout
    return g.op("Cast", symbolic_opset9.eye(g, *arguments), to_i=wanted.onnx_type())


def _computed(value: Any) -> bool:
    return symbolic_helper._is_value(value) and not (
        symbolic_helper._is_none(value) or symbolic_helper._is_constant(value)
    )


def _zero_gradient() -> list[Any]:
    return [aten_node("lightning_ort::zeros_like", ["GO(0)"], ["GI(0)"])]


def register() -> None:
    """Register the symbolics and gradients with ORT's registries (process-wide)."""
    from onnxruntime.training.ortmodule._custom_gradient_registry import CustomGradientRegistry
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    for name in ("atan", "expm1", "trunc"):
        CustomOpSymbolicRegistry.register(name, "", _unary(name))
    CustomOpSymbolicRegistry.register("threshold", "", _threshold)
    CustomOpSymbolicRegistry.register("logsumexp", "", _logsumexp)
    CustomOpSymbolicRegistry.register("cumprod", "", _cumprod)
    CustomOpSymbolicRegistry.register("logcumsumexp", "", _logcumsumexp)
    CustomOpSymbolicRegistry.register("pow", "", _pow)
    for name in ("floor_divide", "floordiv"):  # torch's own rounds down only for div(rounding_mode="floor")
        CustomOpSymbolicRegistry.register(name, "", symbolic_opset9._floor_divide)
    for name in ("__rshift_", "bitwise_right_shift"):
        CustomOpSymbolicRegistry.register(name, "", _right_shift)
    CustomOpSymbolicRegistry.register("eye", "", _eye)
    for name in ("clamp", "clamp_min", "clamp_max", "cumsum"):
        CustomOpSymbolicRegistry.register(name, "", _in_result_type(name))
    register_gradient(_POW, f"{_POW}_backward", ["GO(0)", "I(0)", "I(1)"], ["GI(0)", "GI(1)"])
    register_simple_gradient("atan", "lightning_ort::atan_backward", ["GO(0)", "I(0)"])
    register_simple_gradient("expm1", "lightning_ort::expm1_backward", ["GO(0)", "O(0)"])
    register_simple_gradient("lightning_ort::threshold", "lightning_ort::threshold_backward", ["GO(0)", "I(0)", "I(1)"])
    inputs = ["GO(0)", "I(0)", "O(0)", "I(1)", "I(2)"]
    register_simple_gradient("logsumexp", "lightning_ort::logsumexp_backward", inputs)
    register_simple_gradient("lightning_ort::cumprod", "lightning_ort::cumprod_backward", ["GO(0)", "I(0)", "I(1)"])
    register_simple_gradient("logcumsumexp", "lightning_ort::logcumsumexp_backward", ["GO(0)", "I(0)", "I(1)"])
    CustomGradientRegistry.register(GRAD_DOMAIN, "ATen", ("trunc", ""), _zero_gradient)
    for op_type in ("Sign", "Round", "Floor", "Ceil"):  # step functions: eager's gradient is zero
        CustomGradientRegistry.register("", op_type, (), _zero_gradient)
