"""Sizes read from the parts of ``Tensor.chunk`` follow every batch (chunks.py): they were folded into
the first batch's, and a later batch with as many tokens trained silently wrong."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base
from torch import nn
from torch.utils.data import DataLoader

# the same number of tokens in every batch (token-budget batching), then other numbers
SAME_TOKENS = [(4, 6), (3, 8), (6, 4), (2, 12), (8, 3)]
OTHER_TOKENS = [(4, 6), (3, 7), (2, 9), (5, 2)]


class ChunkedAttention(Base):
    """vit-pytorch's attention: q, k, v from one projection's chunks, heads split with each part's sizes."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.to_qkv = nn.Linear(16, 48, bias=False)
        self.out = nn.Linear(16, 3)

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        b, n, hd = t.shape
        return t.reshape(b, n, 4, hd // 4).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.to_qkv(x)
        if self.kind == "over-length":  # a dimension whose size varies: parts computed in the graph
            first, second = h.chunk(2, dim=1)
            h = torch.cat([second, first * first.shape[1] / x.shape[1]], 1)
        if self.kind == "uneven":  # 48 in 5: parts of 10 and a last one of 8
            parts = h.chunk(5, dim=-1)
            h = torch.cat([parts[-1], *parts[:-1]], -1)
        q, k, v = map(self.split_heads, h.chunk(3, dim=-1))
        attention = (q @ k.transpose(-1, -2) * 0.5).softmax(-1) @ v
        return self.out(attention.permute(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], 16))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        logits = self(batch[0])
        return F.cross_entropy(logits.reshape(-1, 3), batch[1].reshape(-1))


def token_batches(shapes: list[tuple[int, int]]) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(b, t, 16, generator=g), torch.randint(0, 3, (b, t), generator=g)) for b, t in shapes]
    return DataLoader(batches, batch_size=None)


@pytest.mark.parametrize("kind", ["plain", "over-length", "uneven"])
@pytest.mark.parametrize("shapes", [SAME_TOKENS, OTHER_TOKENS], ids=["same-token-count", "other-token-counts"])
def test_sizes_of_chunks_follow_every_batch(kind: str, shapes: list[tuple[int, int]]) -> None:
    eager, ort = fit_both(lambda: ChunkedAttention(kind), lambda: token_batches(shapes), len(shapes))
    assert_ort_ran(ort, len(shapes))
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class ShuffleUnit(Base):
    """ShuffleNetV2's unit: the channels of a BatchNorm's output halved by chunk or split, one half convolved."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.branch = nn.Sequential(nn.Conv2d(4, 4, 1, bias=False), nn.BatchNorm2d(4), nn.ReLU())
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        kept, changed = h.chunk(2, dim=1) if self.kind == "chunk" else h.split(4, dim=1)
        return self.head(torch.cat((kept, self.branch(changed)), 1).mean((2, 3)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


def images() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(b, 3, 8, 8, generator=g), torch.randint(0, 3, (b,), generator=g)) for b in (4, 3, 5)]
    return DataLoader(batches, batch_size=None)


@pytest.mark.parametrize("kind", ["chunk", "split"])
def test_channels_split_after_a_batch_norm_train_in_ort(kind: str) -> None:
    """ORT's shape inference raised on the split sizes it computed as expressions and gave up on the graph;
    ORT then could not type the BatchNorm's outputs and the module fell back."""
    eager, ort = fit_both(lambda: ShuffleUnit(kind), images, 3)
    assert_ort_ran(ort, 3)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
