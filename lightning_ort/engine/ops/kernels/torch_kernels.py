"""Export forms that run torch's own kernels inside ORT's graph (part of ``op_rewrites``).

Convolutions, linear layers, GELU, ReLU, LayerNorm and attention without dropout
(``scaled_dot_product_attention``, also inside ``nn.MultiheadAttention``) are exported as ATen nodes that run
lightning_ort's operators (``csrc/torch_kernels.cc``): torch's oneDNN/MKL kernels, the very calls eager
autograd makes, forward and backward. ORT's CPU kernels for them were 1.3-4x slower than torch's on
this project's workloads (``benchmarks/NOTES.md``), and a mix is worse than either: after a torch
kernel, torch's OpenMP threads keep spinning on the cores ORT's next kernel needs. So the heavy
layers all run on torch's kernels (hand-written attention too: matmul_softmax.py), and ORT keeps
the rest of the graph (element-wise arithmetic, reshapes), its memory planning and its gradient
graph.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import _type_utils, symbolic_helper

from lightning_ort.engine.ops.kernels.gradient_overloads import register_gradient, register_simple_gradient
from lightning_ort.engine.ops.symbolics.attention import repeat_kv_heads, scaled_dot_product_attention_symbolic
from lightning_ort.engine.ops.symbolics.conv_padding import convolution_mode_symbolic, explicit_padding

ATEN = "org.pytorch.aten::ATen"
_CONVOLUTION = "lightning_ort::convolution"
_CONVOLUTION_BIAS = "lightning_ort::convolution_bias"
_LINEAR = "lightning_ort::linear"
_LINEAR_BIAS = "lightning_ort::linear_bias"
_LAYER_NORM = "lightning_ort::layer_norm"
_GELU = "lightning_ort::gelu"
_RELU = "lightning_ort::relu"
_ATTENTION = "lightning_ort::attention"


def _absent(value: Any) -> bool:
    return value is None or symbolic_helper._is_none(value)


def _convolution(
    g: Any,
    input: Any,
    weight: Any,
    bias: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: Any,
    output_padding: Any,
    groups: Any,
    *_flags: Any,
) -> Any:
    layout = (stride, padding, dilation, transposed, output_padding, groups)
    if _absent(bias):
        output = g.op(ATEN, input, weight, *layout, operator_s=_CONVOLUTION)
    else:
        output = g.op(ATEN, input, weight, bias, *layout, operator_s=_CONVOLUTION_BIAS)
    _set_channels(output, input, weight, transposed, groups)
    return output


def _set_channels(output: Any, input: Any, weight: Any, transposed: Any, groups: Any) -> None:
    """Give the ATen node's output the rank and channel count of the convolution's result (later
    symbolics such as a non-affine BatchNorm's need the channels)."""
    rank = symbolic_helper._get_tensor_rank(input)
    weight_sizes = symbolic_helper._get_tensor_sizes(weight)
    is_transposed = symbolic_helper._maybe_get_const(transposed, "b")
    group_count = symbolic_helper._maybe_get_const(groups, "i")
    if rank is None or not weight_sizes or not isinstance(group_count, int) or not isinstance(is_transposed, bool):
        return
    channels = weight_sizes[1] * group_count if is_transposed else weight_sizes[0]
    if not isinstance(channels, int):
        return
    output.setType(input.type().with_sizes([None, channels] + [None] * (rank - 2)))


def _convolution_mode(
    g: Any, input: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any, groups: Any
) -> Any:
    """``padding="same"`` / ``"valid"``: explicit padding (conv_padding.py), then torch's kernel."""
    plan = explicit_padding(g, input, weight, stride, padding, dilation)
    if plan is None:
        return convolution_mode_symbolic(g, input, weight, bias, stride, padding, dilation, groups)
    input, strides, pads, dilations = plan

    def ints(values: list[int]) -> Any:
        return g.op("Constant", value_t=torch.tensor(values, dtype=torch.int64))

    transposed = g.op("Constant", value_t=torch.tensor(False))
    zeros = ints([0] * len(pads))
    return _convolution(g, input, weight, bias, ints(strides), ints(pads), ints(dilations), transposed, zeros, groups)


def _linear(g: Any, input: Any, weight: Any, bias: Any) -> Any:
    weight_rank = symbolic_helper._get_tensor_rank(weight)
    if weight_rank == 1:  # F.linear(x, w) with w of shape (in_features,): x @ w, the last dim dropped
        rows = symbolic_helper._unsqueeze_helper(g, weight, [0])
        rows.setType(weight.type().with_sizes([1, None]))
        output = symbolic_helper._squeeze_helper(g, _linear(g, input, rows, _none(g)), [-1])
        return output if _absent(bias) else g.op("Add", output, bias)
    if weight_rank != 2:
        from torch.onnx._internal.torchscript_exporter import symbolic_opset9

        return symbolic_opset9.linear(g, input, weight, bias)
    if _absent(bias):
        output = g.op(ATEN, input, weight, operator_s=_LINEAR)
    else:
        output = g.op(ATEN, input, weight, bias, operator_s=_LINEAR_BIAS)
    rank = symbolic_helper._get_tensor_rank(input)
    weight_sizes = symbolic_helper._get_tensor_sizes(weight)
    if rank is not None and weight_sizes and isinstance(weight_sizes[0], int):
        output.setType(input.type().with_sizes([None] * (rank - 1) + [weight_sizes[0]]))
    return output


def _layer_norm(g: Any, input: Any, normalized_shape: Any, weight: Any, bias: Any, eps: Any, cudnn: Any) -> Any:
    if _absent(weight) or _absent(bias):  # elementwise_affine=False: constants that need no gradient
        dtype = _type_utils.JitScalarType.from_value(input, _type_utils.JitScalarType.FLOAT).dtype()
        if _absent(weight):
            weight = _filled(g, normalized_shape, 1.0, dtype)
        if _absent(bias):
            bias = _filled(g, normalized_shape, 0.0, dtype)
    eps = g.op("Cast", eps, to_i=torch.onnx.TensorProtoDataType.FLOAT)
    outputs = g.op(ATEN, input, weight, bias, normalized_shape, eps, operator_s=_LAYER_NORM, outputs=3)
    outputs[0].setType(input.type())
    rank = symbolic_helper._get_tensor_rank(input)
    for statistic in outputs[1:]:  # mean and rstd: ORT's type inference needs their types
        statistic.setType(input.type() if rank is None else input.type().with_sizes([None] * rank))
    return outputs[0]


def _filled(g: Any, shape: Any, value: float, dtype: torch.dtype) -> Any:
    """A tensor of ``shape`` (constant, or sizes read from the input: ``F.layer_norm(x, x.shape[-1:])``)
    filled with ``value``."""
    if not symbolic_helper._is_packed_list(shape):
        sizes = symbolic_helper._get_const(shape, "is", "normalized_shape")
        return g.op("Constant", value_t=torch.full(sizes, value, dtype=dtype))
    parts = [g.op("Reshape", size, constant(g, [1], torch.int64)) for size in symbolic_helper._unpack_list(shape)]
    return g.op("ConstantOfShape", g.op("Concat", *parts, axis_i=0), value_t=torch.tensor([value], dtype=dtype))


def _gelu(g: Any, input: Any, approximate: Any = "none") -> Any:
    tanh = symbolic_helper._maybe_get_const(approximate, "s") == "tanh"
    return aten_like(g, _GELU, input, g.op("Constant", value_t=torch.tensor(tanh)))


def _relu(g: Any, input: Any) -> Any:
    return aten_like(g, _RELU, input)


def aten_like(g: Any, operator: str, input: Any, *arguments: Any, same_sizes: bool = True) -> Any:
    """One ATen node running ``operator`` on ``input`` and ``arguments``, whose output has ``input``'s
    type and rank, and its sizes too when ``same_sizes``."""
    output = g.op(ATEN, input, *arguments, operator_s=operator)
    rank = symbolic_helper._get_tensor_rank(input)
    output.setType(input.type() if same_sizes or rank is None else input.type().with_sizes([None] * rank))
    return output


def constant(g: Any, value: Any, dtype: torch.dtype | None = None) -> Any:
    """A ``Constant`` node holding ``value`` (a number or a list) as a tensor of ``dtype`` (torch's
    default for the value when None)."""
    return g.op("Constant", value_t=torch.tensor(value, dtype=dtype))


def _none(g: Any) -> Any:
    """An absent optional input (exported as ONNX's empty input name)."""
    none = g.op("prim::Constant")
    none.setType(torch._C.NoneType.get())
    return none


def _attention(
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
    """``scaled_dot_product_attention`` without dropout: torch's flash-attention (or math) kernels.

    With dropout, ORT's graph keeps the attention (attention.py): a recomputing backward could not
    reproduce the forward's dropout mask."""
    dropout = symbolic_helper._maybe_get_const(dropout_p, "f")
    if symbolic_helper._is_value(dropout) or float(dropout) != 0.0:
        return scaled_dot_product_attention_symbolic(
            g, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa
        )
    if symbolic_helper._maybe_get_const(enable_gqa, "b") is not False:
        key, value = repeat_kv_heads(g, query, key), repeat_kv_heads(g, query, value)
    if attn_mask is None:
        attn_mask = _none(g)
    if scale is None:
        scale = _none(g)
    elif not symbolic_helper._is_none(scale):  # ORT's executor reads float arguments as float32
        scale = g.op("Cast", scale, to_i=torch.onnx.TensorProtoDataType.FLOAT)
    untransposed = [transpose_source(tensor, _SWAP_HEADS) for tensor in (query, key, value)]
    transposed = all(source is not None for source in untransposed)
    if transposed:
        query, key, value = untransposed
    flag = g.op("Constant", value_t=torch.tensor(transposed))
    outputs = g.op(ATEN, query, key, value, attn_mask, scale, is_causal, flag, operator_s=_ATTENTION, outputs=2)
    outputs[0].setType(query.type())
    rank = symbolic_helper._get_tensor_rank(query)
    statistic_type = query.type().with_dtype(torch.float32)
    outputs[1].setType(statistic_type if rank is None else statistic_type.with_sizes([None] * (rank - 1)))
    if not transposed:
        return outputs[0]
    # torch's peephole pass fuses this Transpose with a consumer's transpose(1, 2) into nothing
    return g.op("Transpose", outputs[0], perm_i=_SWAP_HEADS)


_SWAP_HEADS = [0, 2, 1, 3]


def transpose_source(tensor: Any, perm: list[int]) -> Any:
    """The tensor that ``tensor`` is an ONNX ``Transpose`` of by ``perm``, or None.

    Attention usually gets its inputs as ``x.view(batch, length, heads, dim).transpose(1, 2)`` and a
    matmul as ``k.transpose(-2, -1)``; the operator then takes ``x`` (``k``) and the transpose
    becomes a view inside it instead of ORT's copy."""
    node = tensor.node()
    if node.kind() != "onnx::Transpose" or not node.hasAttribute("perm") or getattr(node, "is")("perm") != perm:
        return None
    return node.input()


SYMBOLICS = {
    "_convolution": _convolution,
    "_convolution_mode": _convolution_mode,
    "linear": _linear,
    "layer_norm": _layer_norm,
    "gelu": _gelu,
    "relu": _relu,
    "scaled_dot_product_attention": _attention,
}


def register_convolution_gradients(layout: str = "") -> None:
    """The gradients of ``lightning_ort::convolution<layout>`` and ``convolution_bias<layout>``
    (``layout``: ``"_nhwc"`` for the channels-last forms of channels_last.py)."""
    grads = ["GI(0)", "GI(1)", "GI(2)"]
    backward = f"lightning_ort::convolution{layout}_backward"
    arguments = [f"I({i})" for i in range(2, 8)]
    register_gradient(f"{_CONVOLUTION}{layout}", backward, ["GO(0)", "I(0)", "I(1)", "", *arguments], [*grads[:2], ""])
    arguments = [f"I({i})" for i in range(3, 9)]
    register_gradient(f"{_CONVOLUTION_BIAS}{layout}", backward, ["GO(0)", "I(0)", "I(1)", "I(2)", *arguments], grads)


def register_gradients() -> None:
    """Give ORT's gradient builder the gradients of the operators above (process-wide; unused
    without the rewrites)."""
    register_convolution_gradients()
    grads = ["GI(0)", "GI(1)", "GI(2)"]
    register_gradient(_LINEAR, "lightning_ort::linear_backward_no_bias", ["GO(0)", "I(0)", "I(1)"], grads[:2])
    register_gradient(_LINEAR_BIAS, "lightning_ort::linear_backward", ["GO(0)", "I(0)", "I(1)", "I(2)"], grads)
    inputs = ["GO(0)", "I(0)", "I(1)", "I(2)", "I(3)", "O(1)", "O(2)"]
    register_gradient(_LAYER_NORM, "lightning_ort::layer_norm_backward", inputs, grads)
    inputs = ["GO(0)", "I(0)", "I(1)", "I(2)", "I(3)", "I(4)", "I(5)", "I(6)", "O(0)", "O(1)"]
    register_gradient(_ATTENTION, "lightning_ort::attention_backward", inputs, ["GI(0)", "GI(1)", "GI(2)", "GI(3)"])
    register_simple_gradient(_GELU, "lightning_ort::gelu_backward", ["GO(0)", "I(0)", "I(1)"])
    register_simple_gradient(_RELU, "lightning_ort::relu_backward", ["GO(0)", "O(0)"])
