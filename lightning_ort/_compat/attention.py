"""``F.scaled_dot_product_attention`` with dropout, exported so that ORT trains it like PyTorch.

torch's TorchScript symbolic emits ``Dropout(attn, ratio)`` without the ``training_mode`` input,
which ONNX defines as inference mode (no dropout at all), and with a single output, so ORT's
gradient builder fails on it. ``nn.TransformerEncoderLayer`` (default ``dropout=0.1``) and
``nn.MultiheadAttention`` reach this path in training. We export the attention without dropout and
insert a training-mode ``Dropout`` (with its mask output) before the final MatMul.
"""

from __future__ import annotations

from typing import Any

from torch.onnx._internal.torchscript_exporter import symbolic_helper, symbolic_opset12, symbolic_opset14


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
    if p == 0.0:
        return output
    # PyTorch passes a non-zero dropout_p only in training mode.
    attn_weight, projected_value = list(output.node().inputs())
    dropped, _ = symbolic_opset12._dropout_returns_masked_input_and_mask(g, attn_weight, p, True)
    return g.op("MatMul", dropped, projected_value)


def register() -> None:
    """Register the symbolic with ORT's registry (applied at each ORTModule creation)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("scaled_dot_product_attention", "", scaled_dot_product_attention_symbolic)
