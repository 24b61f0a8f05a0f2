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
