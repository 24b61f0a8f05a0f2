"""``F.scaled_dot_product_attention`` exported so that ORT trains it like PyTorch (without op_rewrites).

- Dropout: torch's TorchScript symbolic emits ``Dropout(attn, ratio)`` without the ``training_mode``
  input, which ONNX defines as inference mode (no dropout at all), and with a single output, so
  ORT's gradient builder fails on it. ``nn.TransformerEncoderLayer`` (default ``dropout=0.1``) and
  ``nn.MultiheadAttention`` reach this path in training. We export the attention without dropout
  and insert a training-mode ``Dropout`` (with its mask output) before the final MatMul.
- Rows masked out entirely (a query allowed no key): eager gives them zero weights and zero
  gradients. torch's symbolic zeroes the NaN weights softmax makes of them, but the gradient of that
  softmax is NaN still, and it reached the query and key projections' weights. Such rows now take a
  softmax of zeros (finite) whose result is replaced by zeros.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import _type_utils, symbolic_helper, symbolic_opset12, symbolic_opset14


def scaled_dot_product_attention_symbolic(
    g: Any,
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: Any = 0.0,
    is_causal: Any = False,
    scale: Any = None,
    enable_gqa: Any = False,
) -> Any:
    p = float(symbolic_helper._maybe_get_const(dropout_p, "f"))
    output = symbolic_opset14.scaled_dot_product_attention(
        g, query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa
    )
    attn_weight, projected_value = list(output.node().inputs())
    masked = not symbolic_helper._is_none(attn_mask)
    if p == 0.0 and not masked:
        return output
    if masked:
        attn_weight = _without_empty_rows(g, attn_weight)
    if p != 0.0:  # PyTorch passes a non-zero dropout_p only in training mode.
        attn_weight, _ = symbolic_opset12._dropout_returns_masked_input_and_mask(g, attn_weight, p, True)
    return g.op("MatMul", attn_weight, projected_value)


def _without_empty_rows(g: Any, attn_weight: Any) -> Any:
    """``attn_weight`` (a softmax of masked scores, possibly behind torch's NaN-zeroing ``Where``)
    computed so that rows whose scores are all -inf get zero weights and zero gradients."""
    node = attn_weight.node()
    if node.kind() == "onnx::Where":  # Where(IsNaN(softmax), 0, softmax)
        node = list(node.inputs())[2].node()
    if node.kind() != "onnx::Softmax":
        return attn_weight
    (scores,) = list(node.inputs())
    minus_infinity = g.op("IsInf", scores, detect_positive_i=0, detect_negative_i=1)
    ones = g.op("Cast", minus_infinity, to_i=_type_utils.JitScalarType.FLOAT.onnx_type())
    all_ones = g.op("ReduceMin", ones, axes_i=[-1], keepdims_i=1)
    empty = g.op("Cast", all_ones, to_i=_type_utils.JitScalarType.BOOL.onnx_type())
    dtype = _type_utils.JitScalarType.from_value(scores, _type_utils.JitScalarType.FLOAT).dtype()
    zero = g.op("Constant", value_t=torch.tensor(0.0, dtype=dtype))
    weights = g.op("Softmax", g.op("Where", empty, zero, scores), axis_i=-1)
    return g.op("Where", empty, zero, weights)


def register() -> None:
    """Register the symbolic with ORT's registry (applied at each ORTModule creation)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("scaled_dot_product_attention", "", scaled_dot_product_attention_symbolic)
