"""Boolean attention masks (True: attend) train in ORT like eager, with and without op_rewrites.

Under op_rewrites, ``F.scaled_dot_product_attention`` runs torch's flash-attention kernels
(``csrc/torch_kernels.cc``), which take only additive masks: a boolean one is converted as eager converts
it. nn.MultiheadAttention and nn.TransformerEncoder turn their boolean masks into additive ones
themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base, sequence_batches
from torch import nn
from torch.utils.data import DataLoader

import lightning_ort


def _lengths(x: torch.Tensor) -> torch.Tensor:
    """A boolean (batch, length) mask of each sequence's true length (at least 1), from the data."""
    batch, length, _ = x.shape
    lengths = (x[:, 0, 0].abs() * length).long().clamp(1, length)
    return torch.arange(length, device=x.device)[None, :] < lengths[:, None]


class Attention(Base):
    """Four heads of ``F.scaled_dot_product_attention`` under a boolean mask, and a head."""

    def __init__(self, mask: str) -> None:
        super().__init__()
        self.mask, self.qkv, self.head = mask, nn.Linear(8, 24), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        batch, length, features = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, 4, 2).permute(2, 0, 3, 1, 4).unbind(0)
        if self.mask == "padding":
            mask = _lengths(x)[:, None, None, :]
        elif self.mask == "causal":
            mask = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        elif self.mask == "input":  # a boolean input of the graph
            mask = keep[:, None, None, :]
        elif self.mask == "pattern":  # per head and query, from the data (the diagonal kept)
            positions = torch.arange(length, device=x.device)
            mask = ((q @ k.transpose(-2, -1)) > 0) | (positions[:, None] == positions[None, :])
        else:  # per head and query, from the data: some rows are masked out entirely
            mask = (q @ k.transpose(-2, -1)) > 0
            if self.mask == "rows-additive":  # the same as a float mask: 0 or -inf
                mask = torch.zeros_like(q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf"))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.head(y.transpose(1, 2).reshape(batch, length, features).mean(1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.mask == "input":
            x, y = batch
            return F.cross_entropy(self(x, _lengths(x)), y)
        return F.cross_entropy(self(batch[0]), batch[1])


class MultiheadAttention(Base):
    """nn.MultiheadAttention with a boolean causal ``attn_mask`` and ``key_padding_mask``."""

    def __init__(self) -> None:
        super().__init__()
        self.attention, self.head = nn.MultiheadAttention(8, 2, batch_first=True), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)  # True: not allowed
        y, _ = self.attention(x, x, x, attn_mask=causal, key_padding_mask=~_lengths(x), need_weights=False)
        return self.head(y.mean(1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


class Encoder(Base):
    """nn.TransformerEncoder (no dropout) with a boolean causal mask and padding mask."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.encoder, self.head = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
        y = self.encoder(x, mask=causal, src_key_padding_mask=~_lengths(x))
        return self.head(y.mean(1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


MODELS: dict[str, Callable[[], Base]] = {
    "sdpa-padding": lambda: Attention("padding"),
    "sdpa-causal": lambda: Attention("causal"),
    "sdpa-per-head": lambda: Attention("pattern"),
    "sdpa-input-mask": lambda: Attention("input"),
    "multihead-attention": MultiheadAttention,
    "transformer-encoder": Encoder,
}


def _sequences() -> DataLoader:
    return sequence_batches([(4, 6), (2, 9), (3, 5), (4, 7)], 8)


@pytest.mark.parametrize("op_rewrites", [True, False], ids=["op-rewrites", "onnx"])
@pytest.mark.parametrize("make_model", MODELS.values(), ids=MODELS.keys())
def test_boolean_attention_mask_trains_in_ort_like_eager(make_model: Callable[[], Base], op_rewrites: bool) -> None:
    strategy = lightning_ort.ORTStrategy(op_rewrites=op_rewrites)
    eager, ort = fit_both(make_model, _sequences, 4, strategy=strategy)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


@pytest.mark.parametrize("op_rewrites", [True, False], ids=["op-rewrites", "onnx"])
@pytest.mark.parametrize("mask", ["rows", "rows-additive"])
def test_fully_masked_rows_train_like_eager(mask: str, op_rewrites: bool) -> None:
    """Queries that may attend to nothing: eager gives them zero output and gradients (without
    op_rewrites, ORT's softmax gradient of such rows was NaN, and so were the projection's weights)."""
    strategy = lightning_ort.ORTStrategy(op_rewrites=op_rewrites)
    eager, ort = fit_both(lambda: Attention(mask), _sequences, 4, strategy=strategy)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
