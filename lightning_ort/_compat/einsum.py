"""``torch.einsum`` and ``torch.outer`` that ORT can differentiate.

ORT's own export turns two-operand einsums with an explicit output and no ellipsis into MatMuls;
every other equation (``"...ij,...jk"``, ``"bij->bji"``, an implicit output, ``"ii->i"``) and
``torch.outer`` became an ONNX ``Einsum`` node, for which ORT 1.19.2 has no gradient, and the model
fell back to PyTorch. Those with one or two operands now run ``torch.einsum`` in an ATen node
(``csrc/einsum_ops.cc``), with eager autograd's gradients; three or more operands keep the
``Einsum`` node (and fall back).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import symbolic_helper

from lightning_ort._compat.gradient_overloads import register_gradient, register_simple_gradient
from lightning_ort._compat.torch_kernels import ATEN

_ONE = "lightning_ort::einsum"
_TWO = "lightning_ort::einsum2"


def _handled_by_ort(equation: str, count: int) -> bool:
    """Whether ORT's own symbolic decomposes ``equation`` into ops it differentiates."""
    if count != 2 or "->" not in equation or "." in equation:
        return False
    inputs = equation.replace(" ", "").split("->")[0].split(",")
    return all(len(labels) == len(set(labels)) for labels in inputs)


def _output_rank(equation: str, tensors: list[Any]) -> int | None:
    equation = equation.replace(" ", "")
    inputs, _, output = equation.partition("->")
    operands = inputs.split(",")
    ellipsis = 0
    for labels, tensor in zip(operands, tensors, strict=True):
        if "..." in labels:
            rank = symbolic_helper._get_tensor_rank(tensor)
            if rank is None:
                return None
            ellipsis = max(ellipsis, rank - len(labels.replace("...", "")))
    if "->" in equation:
        return len(output.replace("...", "")) + (ellipsis if "..." in output else 0)
    letters = [label for label in inputs if label.isalpha()]
    return sum(1 for label in set(letters) if letters.count(label) == 1) + ellipsis


def _einsum_symbolic(ort_export: Any) -> Any:
    @symbolic_helper.parse_args("s", "v", "is")
    def symbolic(g: Any, equation: str, tensor_list: Any, path: Any = None) -> Any:
        tensors = symbolic_helper._unpack_list(tensor_list)
        if _handled_by_ort(equation, len(tensors)) or len(tensors) > 2 or symbolic_helper._is_bool(tensors[0]):
            return ort_export(g, equation, tensor_list)
        codes = g.op("Constant", value_t=torch.tensor([ord(char) for char in equation], dtype=torch.int64))
        output = g.op(ATEN, *tensors, codes, operator_s=_ONE if len(tensors) == 1 else _TWO)
        rank = _output_rank(equation, tensors)
        if rank is not None:
            output.setType(tensors[0].type().with_sizes([None] * rank))
        return output

    return symbolic


@symbolic_helper.parse_args("v", "v")
def _outer(g: Any, input: Any, other: Any) -> Any:
    if symbolic_helper._is_bool(input):
        return None
    codes = g.op("Constant", value_t=torch.tensor([ord(char) for char in "i,j->ij"], dtype=torch.int64))
    output = g.op(ATEN, input, other, codes, operator_s=_TWO)
    output.setType(input.type().with_sizes([None, None]))
    return output


def register() -> None:
    """Register the symbolics and gradients with ORT's registries (process-wide)."""
    from onnxruntime.training.ortmodule import _custom_op_symbolic_registry as ort_symbolics

    ort_symbolics.CustomOpSymbolicRegistry.register("einsum", "", _einsum_symbolic(ort_symbolics.einsum_internal))
    ort_symbolics.CustomOpSymbolicRegistry.register("outer", "", _outer)
    register_simple_gradient(_ONE, f"{_ONE}_backward", ["GO(0)", "I(0)", "I(1)"])
    register_gradient(_TWO, f"{_TWO}_backward", ["GO(0)", "I(0)", "I(1)", "I(2)"], ["GI(0)", "GI(1)"])
