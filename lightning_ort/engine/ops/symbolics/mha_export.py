"""``nn.MultiheadAttention`` exports whose sequence length stays dynamic.

torch's TorchScript exporter infers no shape for a ``Reshape`` to a computed shape (such as
``bsz * num_heads``) and falls back to the size traced for the first batch. torch's
``multi_head_attention_forward`` reads its sequence lengths back from such reshaped tensors
(``k.view(k.shape[0], ...)`` after the q/k/v split, ``src_len = k.size(1)``), so the first batch's
length is exported as a constant and ORT's graph fails at the next length.

During ORT's export lightning_ort therefore traces :func:`multi_head_attention_forward` below for
the common case (no ``bias_k``/``bias_v``, no ``static_k``/``static_v``, as
``nn.TransformerEncoderLayer`` and most models use it; ``add_zero_attn`` pads keys and values with a
zero position, where torch concatenates one): torch 2.13's own steps for that case, with
every length taken from the inputs' shapes, the packed q/k/v taken apart by index (one copy for all
three, unbind.py), and (without
``need_weights``) the heads laid out batch-major so that the export holds no transposes. Same
kernels and values as torch's, up to the summation order of the projections' weight gradients;
other calls run torch's own function.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F


def _in_projection_packed(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    embed_dim = q.size(-1)
    if k is v and q is k:  # self-attention
        packed = F.linear(q, w, b).reshape(*q.shape[:-1], 3, embed_dim)
        return packed[..., 0, :].contiguous(), packed[..., 1, :].contiguous(), packed[..., 2, :].contiguous()
    if k is v:  # encoder-decoder attention
        w_q, w_kv = w.split([embed_dim, embed_dim * 2])
        b_q, b_kv = (None, None) if b is None else b.split([embed_dim, embed_dim * 2])
        packed = F.linear(k, w_kv, b_kv).reshape(*k.shape[:-1], 2, embed_dim)
        return F.linear(q, w_q, b_q), packed[..., 0, :].contiguous(), packed[..., 1, :].contiguous()
    w_q, w_k, w_v = w.chunk(3)
    b_q, b_k, b_v = (None, None, None) if b is None else b.chunk(3)
    return F.linear(q, w_q, b_q), F.linear(k, w_k, b_k), F.linear(v, w_v, b_v)


def _supported(kwargs: dict[str, Any]) -> bool:
    return (
        kwargs["bias_k"] is None
        and kwargs["bias_v"] is None
        and kwargs.get("static_k") is None
        and kwargs.get("static_v") is None
        and not (kwargs["need_weights"] and kwargs["is_causal"] and kwargs["attn_mask"] is None)
    )


def multi_head_attention_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    embed_dim_to_check: int,
    num_heads: int,
    in_proj_weight: torch.Tensor | None,
    in_proj_bias: torch.Tensor | None,
    bias_k: torch.Tensor | None,
    bias_v: torch.Tensor | None,
    add_zero_attn: bool,
    dropout_p: float,
    out_proj_weight: torch.Tensor,
    out_proj_bias: torch.Tensor | None,
    training: bool = True,
    key_padding_mask: torch.Tensor | None = None,
    need_weights: bool = True,
    attn_mask: torch.Tensor | None = None,
    use_separate_proj_weight: bool = False,
    q_proj_weight: torch.Tensor | None = None,
    k_proj_weight: torch.Tensor | None = None,
    v_proj_weight: torch.Tensor | None = None,
    static_k: torch.Tensor | None = None,
    static_v: torch.Tensor | None = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``F.multi_head_attention_forward`` with lengths the exporter keeps dynamic (see the module)."""
    arguments = dict(locals())
    if not _supported(arguments):
        return _ORIGINAL(**arguments)
    is_batched = F._mha_shape_check(query, key, value, key_padding_mask, attn_mask, num_heads)
    if not is_batched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    if need_weights:
        tgt_len, bsz, embed_dim = query.shape
        src_len = key.shape[0]
    else:  # batch-major from here on, sizes read after the transpose: see _batch_major
        query, key, value = _batch_major(query, key, value)
        bsz, tgt_len, embed_dim = query.shape
        src_len = key.shape[1]
    key_padding_mask = F._canonical_mask(
        mask=key_padding_mask,
        mask_name="key_padding_mask",
        other_type=F._none_or_dtype(attn_mask),
        other_name="attn_mask",
        target_type=query.dtype,
    )
    if is_causal and key_padding_mask is None and not need_weights:
        attn_mask = None
    else:
        attn_mask = F._canonical_mask(
            mask=attn_mask,
            mask_name="attn_mask",
            other_type=None,
            other_name="",
            target_type=query.dtype,
            check_other=False,
        )
        if key_padding_mask is not None:
            is_causal = False
    head_dim = embed_dim // num_heads
    if use_separate_proj_weight:
        b_q, b_k, b_v = (None, None, None) if in_proj_bias is None else in_proj_bias.chunk(3)
        q, k, v = F._in_projection(query, key, value, q_proj_weight, k_proj_weight, v_proj_weight, b_q, b_k, b_v)
    else:
        q, k, v = _in_projection_packed(query, key, value, in_proj_weight, in_proj_bias)
    if add_zero_attn:  # a zero key and value after the last position, as torch adds them
        sequence_padding = (0, 0, 0, 0, 0, 1) if need_weights else (0, 0, 0, 1)
        k, v = F.pad(k, sequence_padding), F.pad(v, sequence_padding)
        attn_mask = None if attn_mask is None else F.pad(attn_mask, (0, 1))
        key_padding_mask = None if key_padding_mask is None else F.pad(key_padding_mask, (0, 1))
        src_len = src_len + 1
    shared_mask = attn_mask is not None and attn_mask.dim() == 2  # one (L, S) mask for every batch and head
    if shared_mask:
        attn_mask = attn_mask.unsqueeze(0)
    if key_padding_mask is not None:
        key_padding_mask = (
            key_padding_mask.view(bsz, 1, 1, src_len).expand(-1, num_heads, -1, -1).reshape(bsz * num_heads, 1, src_len)
        )
        attn_mask = key_padding_mask if attn_mask is None else attn_mask + key_padding_mask
        shared_mask = False
    if not training:
        dropout_p = 0.0
    if need_weights:
        q = q.view(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)
        k = k.view(src_len, bsz * num_heads, head_dim).transpose(0, 1)
        v = v.view(src_len, bsz * num_heads, head_dim).transpose(0, 1)
        return _attention_with_weights(
            q, k, v, attn_mask, dropout_p, embed_dim_to_check // num_heads, average_attn_weights, is_batched,
            (tgt_len, bsz, src_len, embed_dim, num_heads), out_proj_weight, out_proj_bias,
        )  # fmt: skip
    if attn_mask is not None:
        # torch tests attn_mask.size(0) == 1, which the trace would freeze; the two forms agree when a
        # (batch * heads, L, S) mask has batch * heads == 1
        attn_mask = attn_mask.unsqueeze(0) if shared_mask else attn_mask.view(bsz, num_heads, -1, src_len)
    q = q.view(bsz, tgt_len, num_heads, head_dim).transpose(1, 2)
    k = k.view(bsz, src_len, num_heads, head_dim).transpose(1, 2)
    v = v.view(bsz, src_len, num_heads, head_dim).transpose(1, 2)
    attn_output = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
    attn_output = attn_output.transpose(1, 2).reshape(bsz, tgt_len, embed_dim)
    attn_output = F.linear(attn_output, out_proj_weight, out_proj_bias).transpose(0, 1)
    if not is_batched:
        attn_output = attn_output.squeeze(1)
    return attn_output, None


def _batch_major(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(batch, length, embed) views of the (length, batch, embed) inputs, shared inputs kept shared.

    ``nn.MultiheadAttention(batch_first=True)`` transposes its inputs to (length, batch, embed) and
    the output back; torch's exporter fuses those transposes with these into nothing, and the heads
    become (batch, length, heads, dim) views that the attention operator takes without a copy
    (torch_kernels.py). Their sizes are read from these views: a size read from the (length, batch,
    embed) input would keep its transpose in the graph. The same values as torch's order: every
    projected row is computed alike."""
    batch_query = query.transpose(0, 1)
    batch_key = batch_query if key is query else key.transpose(0, 1)
    batch_value = batch_key if value is key else value.transpose(0, 1)
    return batch_query, batch_key, batch_value


def _attention_with_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    head_dim: int,
    average_attn_weights: bool,
    is_batched: bool,
    sizes: tuple[Any, ...],
    out_proj_weight: torch.Tensor,
    out_proj_bias: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's ``need_weights=True`` branch; the scale from the module's head size, a Python int
    (torch takes it from ``q.shape``, which the trace would freeze)."""
    tgt_len, bsz, src_len, embed_dim, num_heads = sizes
    q_scaled = q * math.sqrt(1.0 / float(head_dim))
    if attn_mask is not None:
        weights = torch.baddbmm(attn_mask, q_scaled, k.transpose(-2, -1))
    else:
        weights = torch.bmm(q_scaled, k.transpose(-2, -1))
    weights = F.softmax(weights, dim=-1)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    attn_output = torch.bmm(weights, v)
    attn_output = attn_output.transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
    attn_output = F.linear(attn_output, out_proj_weight, out_proj_bias)
    attn_output = attn_output.view(tgt_len, bsz, attn_output.size(1))
    weights = weights.view(bsz, num_heads, tgt_len, src_len)
    if average_attn_weights:
        weights = weights.mean(dim=1)
    if not is_batched:
        attn_output, weights = attn_output.squeeze(1), weights.squeeze(0)
    return attn_output, weights


_ORIGINAL = F.multi_head_attention_forward


@contextlib.contextmanager
def dynamic_attention_shapes() -> Iterator[None]:
    """Within the block (ORT's export), ``nn.MultiheadAttention`` runs :func:`multi_head_attention_forward`."""
    F.multi_head_attention_forward = multi_head_attention_forward
    try:
        yield
    finally:
        F.multi_head_attention_forward = _ORIGINAL
