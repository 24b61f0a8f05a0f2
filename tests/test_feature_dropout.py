"""Channel-wise and alpha dropout train in ORT (``engine/ops/symbolics/feature_dropout.py``); before, torch refused
to export them in training and the whole model fell back to PyTorch.

ORT draws the masks from its own generator, so each ORT run records the masks it drew (read back
from the layer's input and output) and an eager twin, from the same weights and batches, replays
them: losses, weights and buffers must then be eager's.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit
from models import Base
from torch import nn
from torch.utils.data import DataLoader

STEPS = 6
ALPHA = 1.7580993408473766  # ATen's constant in _dropout_impl


class Replay(nn.Module):
    """Applies recorded masks, one per call, as eager's dropout kernel applies a drawn one."""

    def __init__(self, p: float, alpha: bool, masks: list[torch.Tensor]) -> None:
        super().__init__()
        self.p, self.alpha, self.masks = p, alpha, list(masks)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return _apply(h, self.masks.pop(0), self.p, self.alpha)


def _apply(h: torch.Tensor, mask: torch.Tensor, p: float, alpha: bool) -> torch.Tensor:
    noise = mask.to(h.dtype)
    if not alpha:
        return h * noise.div(1 - p)
    a = 1.0 / math.sqrt((ALPHA * ALPHA * p + 1) * (1 - p))
    shift = noise.add(-1).mul(ALPHA * a).add(ALPHA * a * p)
    return h * noise.mul(a) + shift


class DropoutNet(Base):
    """A convolution, the dropout layer under test and a linear head; records each step's input and
    output of the dropout layer."""

    def __init__(self, dropout: nn.Module, dims: int) -> None:
        super().__init__()
        self.conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[dims - 1](3, 8, 3, padding=1)
        self.drop = dropout
        self.head = nn.Linear(8, 3)
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.conv(x))
        dropped = self.drop(h)
        return self.head(dropped.flatten(2).mean(-1)), h, dropped

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits, h, dropped = self(x)
        self.seen.append((h.detach().clone(), dropped.detach().clone()))
        return F.cross_entropy(logits, y)


def _batches(dims: int) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    spatial = {1: (7,), 2: (5, 6), 3: (3, 4, 4)}[dims]
    batches = [
        (torch.randn(n, 3, *spatial, generator=generator), torch.randint(0, 3, (n,), generator=generator))
        for n in (4, 6, 4, 5, 6, 4)
    ]
    return DataLoader(batches, batch_size=None)


def _masks(seen: list[tuple[torch.Tensor, torch.Tensor]], p: float, alpha: bool, feature: bool) -> list[torch.Tensor]:
    """The masks ORT drew, read back from the layer's input and output: a dropped element is 0
    (or alpha dropout's constant), the channels of channel-wise dropout all or nothing."""
    masks = []
    for h, dropped in seen:
        kept = dropped != _apply(h, torch.zeros_like(h), p, alpha)
        if feature:
            per_channel = kept.flatten(2)
            assert torch.equal(per_channel.all(-1), per_channel.any(-1)), "a channel was dropped in part"
            kept = per_channel.all(-1).view(*kept.shape[:2], *[1] * (kept.dim() - 2))
        masks.append(kept)
        torch.testing.assert_close(dropped, _apply(h, kept.expand_as(h), p, alpha), atol=1e-6, rtol=1e-6)
    return masks


CASES = {
    "dropout2d": (lambda: nn.Dropout2d(0.3), 2, 0.3, False, True),
    "dropout1d": (lambda: nn.Dropout1d(0.3), 1, 0.3, False, True),
    "dropout3d": (lambda: nn.Dropout3d(0.5), 3, 0.5, False, True),
    "alpha_dropout": (lambda: nn.AlphaDropout(0.2), 2, 0.2, True, False),
    "feature_alpha_dropout": (lambda: nn.FeatureAlphaDropout(0.2), 2, 0.2, True, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_channel_and_alpha_dropout_train_in_ort_with_eager_gradients(case: str) -> None:
    make_dropout, dims, p, alpha, feature = CASES[case]
    torch.manual_seed(0)
    model = DropoutNet(make_dropout(), dims)
    twin = copy.deepcopy(model)
    ort = fit(model, _batches(dims), "ort", max_steps=STEPS)
    assert_ort_ran(ort, STEPS)
    masks = _masks(model.seen, p, alpha, feature)
    kept = torch.cat([mask.flatten().float() for mask in masks])
    assert abs(float(kept.mean()) - (1 - p)) < 0.15, f"kept {float(kept.mean()):.2f}, expected {1 - p}"
    assert not all(torch.equal(masks[0], mask) for mask in masks[1:] if mask.shape == masks[0].shape)

    twin.drop = Replay(p, alpha, masks)
    eager = fit(twin, _batches(dims), "auto", max_steps=STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_channel_dropout_at_p_zero_is_the_identity() -> None:
    model = DropoutNet(nn.Dropout2d(0.0), 2)
    ort = fit(model, _batches(2), "ort", max_steps=2)
    assert_ort_ran(ort, 2)
    for h, dropped in model.seen:
        assert torch.equal(h, dropped)
