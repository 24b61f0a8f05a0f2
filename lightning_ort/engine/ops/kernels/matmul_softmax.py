"""Attention written out by hand on torch's kernels (part of ``op_rewrites``).

Models that spell attention out (``q @ k.transpose(-2, -1)``, ``masked_fill`` with a causal mask,
``softmax``, ``@ v``, as the GPT example does) are exported with ``matmul``, ``masked_fill`` and
``softmax`` as ATen nodes that run lightning_ort's operators (``csrc/torch_kernels.cc``): the kernels
eager autograd runs. ORT's ``FusedMatMul``, ``Where`` and ``Softmax``/``SoftmaxGrad`` took 1.5-13x
eager's time for them, most on many cores, where ORT's ``Where`` runs on one thread
(``benchmarks/NOTES.md``). A ``transpose`` of the last two dimensions feeding a matmul becomes a
view inside the operator instead of ORT's ``Transpose`` copy.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import _type_utils, symbolic_helper, symbolic_opset9, symbolic_opset13

from lightning_ort.engine.ops.kernels.gradient_overloads import register_gradient, register_simple_gradient
from lightning_ort.engine.ops.kernels.torch_kernels import ATEN, aten_like, transpose_source

_MATMUL = "lightning_ort::matmul"
_SOFTMAX = "lightning_ort::softmax"
_MASKED_FILL = "lightning_ort::masked_fill"


def _matmul(g: Any, self: Any, other: Any) -> Any:
    ranks = symbolic_helper._get_tensor_rank(self), symbolic_helper._get_tensor_rank(other)
    if None in ranks or min(ranks) < 2:  # vectors: ONNX's MatMul, as torch exports it
        return symbolic_opset9.matmul(g, self, other)
    inputs, flags = [], []
    for tensor, rank in zip((self, other), ranks, strict=True):
        source = transpose_source(tensor, [*range(rank - 2), rank - 1, rank - 2])
        inputs.append(tensor if source is None else source)
        flags.append(g.op("Constant", value_t=torch.tensor(source is not None)))
    output = g.op(ATEN, *inputs, *flags, operator_s=_MATMUL)
    output.setType(self.type().with_sizes([None] * max(ranks)))
    return output


def _softmax(g: Any, input: Any, dim: Any, dtype: Any = None) -> Any:
    if dtype is not None and not symbolic_helper._is_none(dtype):  # a softmax that casts: ORT's
        return symbolic_opset13.softmax(g, input, dim, dtype)
    return aten_like(g, _SOFTMAX, input, dim)


def _masked_fill(g: Any, self: Any, mask: Any, value: Any) -> Any:
    fill = symbolic_helper._maybe_get_scalar(value)
    if symbolic_helper._is_value(fill):  # a fill value that is a graph input could need a gradient
        return symbolic_opset9.masked_fill(g, self, mask, value)
    dtype = _type_utils.JitScalarType.from_value(self, _type_utils.JitScalarType.FLOAT).dtype()
    fill_value = g.op("Constant", value_t=fill.to(dtype))
    boolean = g.op("Cast", mask, to_i=torch.onnx.TensorProtoDataType.BOOL)
    sizes = g.op("Shape", self)
    output = g.op(ATEN, self, boolean, fill_value, sizes, operator_s=_MASKED_FILL)
    rank = symbolic_helper._get_tensor_rank(self)
    mask_rank = symbolic_helper._get_tensor_rank(mask)
    ranks_known = rank is not None and mask_rank is not None
    output.setType(self.type().with_sizes([None] * max(rank, mask_rank)) if ranks_known else self.type())
    return output


SYMBOLICS = {"matmul": _matmul, "bmm": _matmul, "softmax": _softmax, "masked_fill": _masked_fill}


def register_gradients() -> None:
    """Give ORT's gradient builder the gradients of the operators above (process-wide)."""
    register_gradient(_MATMUL, "lightning_ort::matmul_backward", ["GO(0)", "I(0)", "I(1)", "I(2)", "I(3)"],
                      ["GI(0)", "GI(1)"])  # fmt: skip
    register_simple_gradient(_SOFTMAX, "lightning_ort::softmax_backward", ["GO(0)", "O(0)", "I(1)"])
    register_simple_gradient(_MASKED_FILL, "lightning_ort::masked_fill_backward", ["GO(0)", "I(1)", "I(3)"])
