"""Tensors split into parts of which some get no gradient (unused, detached or used only through a
comparison) train through ORT like eager PyTorch; ORT 1.19.2 alone crashes in the backward pass."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

STEPS = 5


class PartlyUsedSplit(Base):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.proj = nn.Linear(12, 24)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        if self.kind == "unused-chunk":
            a, _, c = h.chunk(3, dim=-1)
            return self.head(a * c)
        if self.kind == "detached-chunk":
            a, b, c = h.chunk(3, dim=-1)
            return self.head(a + b.detach() + c)
        if self.kind == "compared-chunk":
            a, b, c = h.chunk(3, dim=-1)
            return self.head(a * (b > 0).to(a.dtype) + c)
        if self.kind == "unequal-split":
            _, rest = h.split([4, 20], dim=-1)
            return self.head(rest[:, :8] + rest[:, 12:])
        parts = h.view(-1, 3, 8).transpose(0, 1)  # detached select, as a frozen query of q/k/v
        return self.head(parts[0].detach() * parts[1] + parts[2])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(40, 12, generator=g), torch.randint(0, 3, (40,), generator=g)), 8)


@pytest.mark.parametrize(
    "kind", ["unused-chunk", "detached-chunk", "compared-chunk", "unequal-split", "detached-select"]
)
def test_split_with_parts_without_gradient_trains_like_eager(kind: str) -> None:
    eager, ort = fit_both(lambda: PartlyUsedSplit(kind), loader, STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
