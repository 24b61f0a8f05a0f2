"""Element-wise functions ORT could not train, on torch's kernels inside ORT's graph.

torch 2.13 cannot export ``lgamma``, ``digamma``, ``polygamma``, ``mvlgamma``, ``erfinv``, ``erfc``,
``exp2``, ``sinc``, ``frac``, ``deg2rad``, ``sgn``, ``i0``, ``asinh``, ``acosh``, ``atanh`` and
``torch.special``'s ``ndtr``, ``log_ndtr``, ``entr`` and kin, nor ``atan2``, ``hypot``,
``copysign``, ``xlogy``, ``xlog1py``, ``logaddexp``, ``logaddexp2`` and ``float_power`` (computed in
float64, as eager does); ORT 1.19.2 has no gradient for the ONNX forms of ``fmod`` and
``remainder``. Models using them fell back to PyTorch: among them every ``torch.distributions``
log-probability built on ``lgamma`` or ``xlogy`` (Beta, Gamma, Dirichlet, Poisson, StudentT). They
are exported as ATen nodes running torch's kernels, with eager autograd itself as their gradients
(``csrc/special_functions.cc``), so results equal eager's; a Python number among the operands
(``torch.xlogy(2.0, t)``, ``x % 3``) becomes a constant of the result's type.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import _type_utils, symbolic_helper

from lightning_ort.engine.ops.kernels.gradient_overloads import register_gradient, register_simple_gradient
from lightning_ort.engine.ops.kernels.torch_kernels import ATEN, constant

# torch's operator -> lightning_ort's (csrc/special_functions.cc)
UNARY = {
    "lgamma": "lgamma",
    "special_gammaln": "lgamma",
    "digamma": "digamma",
    "special_psi": "digamma",
    "special_digamma": "digamma",
    "erfinv": "erfinv",
    "special_erfinv": "erfinv",
    "erfc": "erfc",
    "special_erfc": "erfc",
    "exp2": "exp2",
    "special_exp2": "exp2",
    "sinc": "sinc",
    "special_sinc": "sinc",
    "frac": "frac",
    "deg2rad": "deg2rad",
    "rad2deg": "rad2deg",
    "sgn": "sgn",
    "i0": "i0",
    "special_i0": "i0",
    "asinh": "asinh",
    "arcsinh": "asinh",
    "acosh": "acosh",
    "arccosh": "acosh",
    "atanh": "atanh",
    "arctanh": "atanh",
    "special_i0e": "special_i0e",
    "special_i1": "special_i1",
    "special_i1e": "special_i1e",
    "special_ndtr": "special_ndtr",
    "special_ndtri": "special_ndtri",
    "special_log_ndtr": "special_log_ndtr",
    "special_entr": "special_entr",
    "special_erfcx": "special_erfcx",
}
BINARY = {
    "atan2": "atan2",
    "arctan2": "atan2",
    "hypot": "hypot",
    "copysign": "copysign",
    "xlogy": "xlogy",
    "special_xlogy": "xlogy",
    "special_xlog1py": "xlog1py",
    "logaddexp": "logaddexp",
    "logaddexp2": "logaddexp2",
    "fmod": "fmod",
    "remainder": "remainder",
    "float_power": "float_power",
}


def _result_type(g: Any) -> Any:
    return _type_utils.JitScalarType.from_value(g.original_node.output(), _type_utils.JitScalarType.UNDEFINED)


def _operand(g: Any, value: Any, wanted: Any) -> Any:
    """``value`` in the result's type ``wanted``: eager computes in the promoted type too."""
    if symbolic_helper._is_constant(value):  # a Python number, or a tensor made in forward
        held = torch.as_tensor(symbolic_helper._maybe_get_const(value, "t"))
        return g.op("Constant", value_t=held.to(wanted.dtype()))
    if _type_utils.JitScalarType.from_value(value, _type_utils.JitScalarType.UNDEFINED) != wanted:
        value = g.op("Cast", value, to_i=wanted.onnx_type())
    return value


def _typed(g: Any, output: Any, wanted: Any) -> Any:
    rank = symbolic_helper._get_tensor_rank(g.original_node.output())
    if rank is not None:
        output.setType(g.original_node.output().type().with_dtype(wanted.dtype()).with_sizes([None] * rank))
    return output


def _unary(operator: str) -> Any:
    def symbolic(g: Any, self: Any) -> Any:
        wanted = _result_type(g)
        if wanted == _type_utils.JitScalarType.UNDEFINED:
            return symbolic_helper._unimplemented(operator, "result type unknown", self)
        return _typed(g, g.op(ATEN, _operand(g, self, wanted), operator_s=operator), wanted)

    return symbolic


def _with_integer(operator: str, integer_first: bool) -> Any:
    """``polygamma(n, x)`` and ``mvlgamma(x, p)``: an integer parameter known at export."""

    def symbolic(g: Any, first: Any, second: Any) -> Any:
        self, parameter = (second, first) if integer_first else (first, second)
        value = symbolic_helper._maybe_get_const(parameter, "i")
        wanted = _result_type(g)
        if symbolic_helper._is_value(value) or wanted == _type_utils.JitScalarType.UNDEFINED:
            return symbolic_helper._unimplemented(operator, "parameter not constant", self)
        output = g.op(ATEN, _operand(g, self, wanted), constant(g, int(value), torch.int64), operator_s=operator)
        return _typed(g, output, wanted)

    return symbolic


def _binary(operator: str) -> Any:
    def symbolic(g: Any, self: Any, other: Any) -> Any:
        wanted = _result_type(g)
        if wanted == _type_utils.JitScalarType.UNDEFINED:
            return symbolic_helper._unimplemented(operator, "result type unknown", self)
        operands = [_operand(g, value, wanted) for value in (self, other)]
        return _typed(g, g.op(ATEN, *operands, operator_s=operator), wanted)

    return symbolic


def register() -> None:
    """Register the symbolics and gradients with ORT's registries (process-wide)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    for name, ours in UNARY.items():
        CustomOpSymbolicRegistry.register(name, "", _unary(f"lightning_ort::{ours}"))
    for ours in set(UNARY.values()) | {"polygamma", "mvlgamma"}:
        inputs = ["GO(0)", "I(0)"] + (["I(1)"] if ours in ("polygamma", "mvlgamma") else [])
        register_simple_gradient(f"lightning_ort::{ours}", f"lightning_ort::{ours}_backward", inputs)
    CustomOpSymbolicRegistry.register("polygamma", "", _with_integer("lightning_ort::polygamma", True))
    CustomOpSymbolicRegistry.register("special_polygamma", "", _with_integer("lightning_ort::polygamma", True))
    CustomOpSymbolicRegistry.register("mvlgamma", "", _with_integer("lightning_ort::mvlgamma", False))
    CustomOpSymbolicRegistry.register("special_multigammaln", "", _with_integer("lightning_ort::mvlgamma", False))
    for name, ours in BINARY.items():
        CustomOpSymbolicRegistry.register(name, "", _binary(f"lightning_ort::{ours}"))
    for ours in set(BINARY.values()):
        operator = f"lightning_ort::{ours}"
        register_gradient(operator, f"{operator}_backward", ["GO(0)", "I(0)", "I(1)"], ["GI(0)", "GI(1)"])
