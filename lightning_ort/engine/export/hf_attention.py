"""Hugging Face transformers' ``sdpa`` attention (its default ``attn_implementation``) exported for ORT.

transformers' ``sdpa_attention_forward`` decides two things from tensor sizes, which the export
traces as tensors, so each decision is a Python branch the export would freeze (lightning_ort
refuses the module):

- ``is_causal = q_length > 1 and attention_mask is None and is_causal``: for one query token the
  causal flag is dropped (a decoding step attends to the whole cache);
- grouped-query attention (``num_key_value_groups > 1``): ``enable_gqa=True`` when there is no
  mask and the head size is at most 256, ``pack_gqa`` for one query token, ``repeat_kv`` otherwise.

Under ORT's export only, :func:`exported_sdpa` puts a function in its place that gives eager's
results for every sequence length without those branches:

- when the query and the keys have the same length (self-attention without a cache: both come from
  the same hidden states, so they have it on every call), SDPA's causal mask is eager's choice for
  every length: for one token it masks nothing, exactly as ``is_causal=False`` would;
- grouped key and value heads are repeated (``repeat_kv``), which computes what ``enable_gqa`` and
  ``pack_gqa`` compute.

Other calls (a cache longer than the query, a paged cache, ``softcap``, ``output_attentions``) go
to transformers' own function, whose size branches the export then refuses as before.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from lightning_ort.engine.export.tracing_state import untraced

_SDPA = "sdpa"


def _untraced_length(tensor: torch.Tensor, dim: int) -> int:
    """``tensor.shape[dim]`` as a number, read outside the trace (no node, no TracerWarning)."""
    with untraced():
        return int(tensor.shape[dim])


def _exported_sdpa_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    from transformers.integrations.sdpa_attention import create_position_bias_mask, repeat_kv

    def sdpa_attention_forward(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        is_causal: bool | None = None,
        position_bias: torch.Tensor | None = None,
        cache: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        arguments = (module, query, key, value, attention_mask, dropout, scaling, is_causal, position_bias, cache)
        if (
            not torch.jit.is_tracing()
            or cache is not None
            or kwargs.get("softcap") is not None
            or kwargs.get("output_attentions", False)
        ):
            return original(*arguments, **kwargs)
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        causal = bool(causal) and attention_mask is None
        if causal and _untraced_length(query, 2) != _untraced_length(key, 2):
            return original(*arguments, **kwargs)  # a cache: eager's choice depends on the query's length
        groups = getattr(module, "num_key_value_groups", 1)
        if groups > 1:
            key = repeat_kv(key, groups)
            value = repeat_kv(value, groups)
        if position_bias is not None:
            attention_mask = create_position_bias_mask(position_bias, attention_mask, causal, query, key)
            causal = False
        output = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal
        )
        return output.transpose(1, 2).contiguous(), None

    return sdpa_attention_forward


@contextlib.contextmanager
def exported_sdpa() -> Iterator[None]:
    """Within the block, transformers' ``sdpa`` attention (when transformers is imported and its function is
    the registered one) is the export-friendly form above while a trace runs."""
    modeling_utils = sys.modules.get("transformers.modeling_utils")
    interface = getattr(modeling_utils, "AttentionInterface", None)
    mapping: dict[str, Callable[..., Any]] | None = getattr(interface, "_global_mapping", None)
    original = None if mapping is None else mapping.get(_SDPA)
    if original is None or getattr(original, "__module__", "") != "transformers.integrations.sdpa_attention":
        yield
        return
    assert mapping is not None
    mapping[_SDPA] = _exported_sdpa_forward(original)
    try:
        yield
    finally:
        mapping[_SDPA] = original
