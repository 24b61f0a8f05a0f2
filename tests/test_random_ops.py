"""Random tensors drawn inside ``forward`` come out of ORT's graph with eager's dtype and distribution."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from helpers import assert_ort_ran, fit
from models import MLP, mlp_loader


class NoisyInput(MLP):
    """Adds N(0.5, 2^2) noise drawn with ``Tensor.normal_`` to its input, and returns the noise."""

    def __init__(self) -> None:
        super().__init__()
        self.noises: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        noise = torch.empty_like(x).normal_(0.5, 2.0)
        return self.head(self.body(x + 0.01 * noise)), noise

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits, noise = self(x)
        self.noises.append(noise.detach().clone())
        return F.cross_entropy(logits, y)


def test_normal_noise_has_the_dtype_and_distribution_asked_for() -> None:
    model = NoisyInput()
    result = fit(model, mlp_loader(), "ort", max_steps=8)
    assert_ort_ran(result, 8)
    assert all(noise.dtype == torch.float32 for noise in model.noises)
    assert not torch.equal(model.noises[0], model.noises[1])  # fresh draws every call
    pooled = torch.cat([noise.flatten() for noise in model.noises])
    assert abs(float(pooled.mean()) - 0.5) < 0.2 and abs(float(pooled.std()) - 2.0) < 0.2


class BernoulliMask(MLP):
    """Keeps each hidden feature with probability 0.2 (``torch.bernoulli``, as DropBlock); returns the mask."""

    def __init__(self) -> None:
        super().__init__()
        self.masks: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.body(x)
        mask = torch.bernoulli(torch.full_like(hidden, 0.2))
        return self.head(hidden * mask / 0.2), mask

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits, mask = self(x)
        self.masks.append(mask.detach().clone())
        return F.cross_entropy(logits, y)


def test_bernoulli_of_probabilities_keeps_with_those_probabilities() -> None:
    # ORT's Bernoulli kernel drew 1 with probability 1 - p: 80% of the features were kept, not 20%
    model = BernoulliMask()
    result = fit(model, mlp_loader(), "ort", max_steps=8)
    assert_ort_ran(result, 8)
    assert not torch.equal(model.masks[0], model.masks[1])
    assert abs(float(torch.cat([mask.flatten() for mask in model.masks]).mean()) - 0.2) < 0.03
