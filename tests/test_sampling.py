"""Spatial transformers (``F.affine_grid``, ``F.grid_sample``) and ``F.fold`` train in ORT like eager
(``engine/ops/kernels/sampling.py``); before, they fell back to PyTorch (no export at opset 17, or no gradient
for ``GridSample`` in ORT)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base
from torch import nn
from torch.utils.data import DataLoader

STEPS = 5


class Sampler(Base):
    """A convolution, then the sampling under test, then a pooled linear head."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.theta = nn.Linear(3, 6)
        self.head = nn.Linear(8 if kind != "transformer" else 3, 3)
        self.register_buffer("identity", torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "transformer":  # the image itself is sampled: only the grid needs a gradient
            theta = self.theta(x.mean((2, 3))).view(-1, 2, 3) * 0.2 + self.identity
            grid = F.affine_grid(theta, list(x.shape), align_corners=False)
            return self.head(F.grid_sample(x, grid, align_corners=False).mean((2, 3)))
        h = torch.tanh(self.conv(x))
        if self.kind == "grid_sample":  # both inputs need gradients
            grid = torch.tanh(h[:, :2].permute(0, 2, 3, 1) * 2)
            h = F.grid_sample(h, grid, mode="bilinear", padding_mode="border", align_corners=True)
        elif self.kind == "nearest_grid_sample":
            grid = torch.tanh(h[:, 2:4].permute(0, 2, 3, 1))
            h = F.grid_sample(h, grid, mode="nearest", padding_mode="zeros", align_corners=False)
        else:  # overlapping patches summed back: fold after unfold
            patches = F.unfold(h, 3, padding=1, stride=2)
            h = F.fold(patches * 0.5, h.shape[-2:], 3, padding=1, stride=2)
        return self.head(h.mean((2, 3)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)


def _batches() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(n, 3, 7, 8, generator=generator), torch.randint(0, 3, (n,), generator=generator))
        for n in (4, 6, 4, 5, 6)
    ]
    return DataLoader(batches, batch_size=None)


@pytest.mark.parametrize("kind", ["transformer", "grid_sample", "nearest_grid_sample", "fold"])
def test_sampling_trains_in_ort_like_eager(kind: str) -> None:
    eager, ort = fit_both(lambda: Sampler(kind), _batches, max_steps=STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
