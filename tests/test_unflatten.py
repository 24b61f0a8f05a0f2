"""Sizes read from ``Tensor.unflatten``'s result follow every batch (unflatten.py): they were folded into the
first batch's, and later batches with as many elements trained silently wrong."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base
from torch import nn
from torch.utils.data import DataLoader


class Unflattened(Base):
    """Tokens flattened over the batch, unflattened again, then reshaped with the result's own sizes."""

    def __init__(self, sizes: str) -> None:
        super().__init__()
        self.sizes = sizes
        self.embed, self.mix, self.head = nn.Embedding(20, 6), nn.Linear(6, 4), nn.Linear(4, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = self.embed(ids).flatten(0, 1)
        if self.sizes == "from-input":
            h = flat.unflatten(0, (ids.size(0), -1))
        elif self.sizes == "constant-tail":
            h = flat.unflatten(-1, (2, 3)).flatten(-2).unflatten(0, (-1, ids.shape[1]))
        else:
            h = flat.unflatten(0, (-1, ids.shape[1]))
        n, t, d = h.shape
        mixed = self.mix(h.reshape(n * t, d)).view(n, t, -1)
        return self.head(mixed.softmax(1).mean(1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


def batches() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    shapes = [(2, 6), (3, 4), (4, 3), (6, 2), (3, 5)]  # as many tokens, then another count
    data = [(torch.randint(0, 20, (b, t), generator=g), torch.randint(0, 3, (b,), generator=g)) for b, t in shapes]
    return DataLoader(data, batch_size=None)


@pytest.mark.parametrize("sizes", ["from-input", "minus-one", "constant-tail"])
def test_sizes_of_an_unflattened_tensor_follow_every_batch(sizes: str) -> None:
    eager, ort = fit_both(lambda: Unflattened(sizes), batches, 5)
    assert_ort_ran(ort, 5)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
