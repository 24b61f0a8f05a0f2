"""Activations ORT cannot differentiate, on torch's kernels inside ORT's graph.

torch exports ``F.hardswish``, ``F.hardsigmoid``, ``F.softplus`` (and so ``F.mish``), ``F.elu``,
``F.selu`` and ``F.celu`` as ONNX ops that ORT 1.19.2 has no gradient for, so models with them
(MobileNetV3's blocks, for one) could not train in ORT and fell back to PyTorch. They are exported
as ATen nodes running lightning_ort's operators (``csrc/activations.cc``): torch's kernels,
forward and backward, whatever ``op_rewrites`` says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import symbolic_helper

from lightning_ort.engine.ops import registry
from lightning_ort.engine.ops.kernels.gradient_overloads import register_simple_gradient
from lightning_ort.engine.ops.kernels.torch_kernels import aten_like

# lightning_ort's operators here, element by element (channels_last.py keeps their layout)
OPERATORS = registry.family_operators("ops.kernels.activations")  # hardswish, hardsigmoid, mish, softplus, elu, selu
# the forward's scalar arguments each backward takes after the output's gradient and the input
_SCALAR_ARGUMENTS = {"lightning_ort::softplus": ["I(1)", "I(2)"], "lightning_ort::elu": ["I(1)", "I(2)", "I(3)"]}


def _floats(g: Any, *values: float) -> list[Any]:
    return [g.op("Constant", value_t=torch.tensor(value, dtype=torch.float32)) for value in values]


def _const(value: Any, name: str) -> float:
    return float(symbolic_helper._get_const(value, "f", name))


def _unary(operator: str) -> Callable[..., Any]:
    def symbolic(g: Any, self: Any) -> Any:
        return aten_like(g, operator, self)

    return symbolic


def _softplus(g: Any, self: Any, beta: Any, threshold: Any) -> Any:
    floats = _floats(g, _const(beta, "beta"), _const(threshold, "threshold"))
    return aten_like(g, "lightning_ort::softplus", self, *floats)


def _elu(g: Any, self: Any, alpha: Any, scale: Any, input_scale: Any) -> Any:
    floats = _floats(g, _const(alpha, "alpha"), _const(scale, "scale"), _const(input_scale, "input_scale"))
    return aten_like(g, "lightning_ort::elu", self, *floats)


def _celu(g: Any, self: Any, alpha: Any) -> Any:
    value = _const(alpha, "alpha")
    return aten_like(g, "lightning_ort::elu", self, *_floats(g, value, 1.0, 1.0 / value))


def register() -> None:
    """Register the symbolics and gradients with ORT's registries (process-wide)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    for name in ("hardswish", "hardsigmoid", "mish", "selu"):
        CustomOpSymbolicRegistry.register(name, "", _unary(f"lightning_ort::{name}"))
    CustomOpSymbolicRegistry.register("softplus", "", _softplus)
    CustomOpSymbolicRegistry.register("elu", "", _elu)
    CustomOpSymbolicRegistry.register("celu", "", _celu)
    for operator in OPERATORS:
        inputs = ["GO(0)", "I(0)", *_SCALAR_ARGUMENTS.get(operator, [])]
        register_simple_gradient(operator, f"{operator}_backward", inputs)
