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
- Grouped-query attention (``enable_gqa=True``, fewer key/value heads than query heads; Hugging Face's
  Llama, Mistral and Qwen2 pass it): torch's symbolic refuses it. The key and value heads are
  repeated to the query's count (``repeat_interleave`` over the head dimension), which is what
  eager's kernels compute.
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
    if symbolic_helper._maybe_get_const(enable_gqa, "b") is not False:
        key, value = repeat_kv_heads(g, query, key), repeat_kv_heads(g, query, value)
    output = symbolic_opset14.scaled_dot_product_attention(
        g, query, key, value, attn_mask, 0.0, is_causal, scale, False
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


def repeat_kv_heads(g: Any, query: Any, tensor: Any) -> Any:
    """``tensor`` (``(..., kv_heads, length, dim)``) with each head repeated ``query_heads // kv_heads`` times in
    place, ``tensor.repeat_interleave(query_heads // kv_heads, dim=-3)``: grouped-query attention's key or value."""
    rank = symbolic_helper._get_tensor_rank(tensor)
    if rank is None or rank < 3 or symbolic_helper._get_tensor_rank(query) != rank:
        raise RuntimeError(
            "scaled_dot_product_attention(enable_gqa=True): the export needs the rank of query, key and value "
            f"(got {symbolic_helper._get_tensor_rank(query)} and {rank})"
        )
    heads_axis = rank - 3

    def dims(shape: Any, start: int, end: int) -> Any:
        return symbolic_helper._slice_helper(g, shape, axes=[0], starts=[start], ends=[end])

    shape = g.op("Shape", tensor)
    kv_heads = dims(shape, heads_axis, heads_axis + 1)
    query_heads = dims(g.op("Shape", query), heads_axis, heads_axis + 1)
    groups = g.op("Div", query_heads, kv_heads)
    leading, trailing = dims(shape, 0, heads_axis + 1), dims(shape, heads_axis + 1, rank)
    expanded = g.op(
        "Expand",
        symbolic_helper._unsqueeze_helper(g, tensor, [heads_axis + 1]),
        g.op("Concat", leading, groups, trailing, axis_i=0),
    )
    heads_first = dims(shape, 0, heads_axis)
    return g.op("Reshape", expanded, g.op("Concat", heads_first, query_heads, trailing, axis_i=0))


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
