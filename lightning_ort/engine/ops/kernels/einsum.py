"""``torch.einsum`` and ``torch.outer`` that ORT can differentiate.

ORT's own export turns two-operand einsums with an explicit output and no ellipsis into MatMuls;
every other equation (``"...ij,...jk"``, ``"bij->bji"``, an implicit output, ``"ii->i"``) and
``torch.outer`` became an ONNX ``Einsum`` node, for which ORT 1.19.2 has no gradient, and the model
fell back to PyTorch. Those with one or two operands now run ``torch.einsum`` in an ATen node
(``csrc/einsum.cc``), with eager autograd's gradients; three or more operands keep the
``Einsum`` node (and fall back).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import symbolic_helper

from lightning_ort.engine.ops.kernels.gradient_overloads import register_gradient, register_simple_gradient
from lightning_ort.engine.ops.kernels.shape_inference import einsum_shape
from lightning_ort.engine.ops.kernels.torch_kernels import ATEN, constant

_ONE = "lightning_ort::einsum"
_TWO = "lightning_ort::einsum2"


def _codes(g: Any, equation: str) -> Any:
    """The equation as the ATen node takes it: its character codes (ORT's executor passes no strings)."""
    return constant(g, [ord(char) for char in equation], torch.int64)


def _handled_by_ort(equation: str, count: int) -> bool:
    """Whether ORT's own symbolic decomposes ``equation`` into ops it differentiates."""
    if count != 2 or "->" not in equation or "." in equation:
        return False
    inputs = equation.replace(" ", "").split("->")[0].split(",")
    return all(len(labels) == len(set(labels)) for labels in inputs)


def _output_rank(equation: str, tensors: list[Any]) -> int | None:
    ranks = [symbolic_helper._get_tensor_rank(tensor) for tensor in tensors]
    shape = einsum_shape(equation, [None if rank is None else [None] * rank for rank in ranks])
    return None if shape is None else len(shape)


def _einsum_symbolic(ort_export: Any) -> Any:
    @symbolic_helper.parse_args("s", "v", "is")
    def symbolic(g: Any, equation: str, tensor_list: Any, path: Any = None) -> Any:
        tensors = symbolic_helper._unpack_list(tensor_list)
        if _handled_by_ort(equation, len(tensors)) or len(tensors) > 2 or symbolic_helper._is_bool(tensors[0]):
            return ort_export(g, equation, tensor_list)
        output = g.op(ATEN, *tensors, _codes(g, equation), operator_s=_ONE if len(tensors) == 1 else _TWO)
        rank = _output_rank(equation, tensors)
        if rank is not None:
            output.setType(tensors[0].type().with_sizes([None] * rank))
        return output

    return symbolic


@symbolic_helper.parse_args("v", "v")
def _outer(g: Any, input: Any, other: Any) -> Any:
    if symbolic_helper._is_bool(input):
        return None
    output = g.op(ATEN, input, other, _codes(g, "i,j->ij"), operator_s=_TWO)
    output.setType(input.type().with_sizes([None, None]))
    return output


def register() -> None:
    """Register the symbolics and gradients with ORT's registries (process-wide)."""
    from onnxruntime.training.ortmodule import _custom_op_symbolic_registry as ort_symbolics

    ort_symbolics.CustomOpSymbolicRegistry.register("einsum", "", _einsum_symbolic(ort_symbolics.einsum_internal))
    ort_symbolics.CustomOpSymbolicRegistry.register("outer", "", _outer)
    register_simple_gradient(_ONE, f"{_ONE}_backward", ["GO(0)", "I(0)", "I(1)"])
    register_gradient(_TWO, f"{_TWO}_backward", ["GO(0)", "I(0)", "I(1)", "I(2)"], ["GI(0)", "GI(1)"])
