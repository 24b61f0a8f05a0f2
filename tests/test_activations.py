"""Activations whose ONNX forms ORT cannot differentiate train in ORT like eager (activations.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import MLP, Base, image_loader, mlp_loader
from torch import nn

import lightning_ort

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "softplus": F.softplus,
    "softplus-beta": lambda x: F.softplus(x, beta=2.0, threshold=3.0),
    "mish": F.mish,
    "elu": lambda x: F.elu(x, alpha=0.3),
    "selu": F.selu,
    "celu": lambda x: F.celu(x, alpha=0.7),
}


class Activated(MLP):
    def __init__(self, activation: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.activation(3 * self.body(x)))


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_trains_in_ort_like_eager(name: str) -> None:
    eager, ort = fit_both(lambda: Activated(ACTIVATIONS[name]), mlp_loader, 8)
    assert_ort_ran(ort, 8)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class MobileBlock(Base):
    """MobileNetV3's inverted residual: hardswish, and a squeeze-and-excitation gate with hardsigmoid."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(3, 16, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
        self.depthwise = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False), nn.BatchNorm2d(16))
        self.squeeze, self.excite = nn.Conv2d(16, 4, 1), nn.Conv2d(4, 16, 1)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.hardswish(self.depthwise(self.expand(x)))
        h = h * F.hardsigmoid(self.excite(F.relu(self.squeeze(F.adaptive_avg_pool2d(h, 1)))))
        return self.head(h.mean((2, 3)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


@pytest.mark.parametrize("options", [{}, {"channels_last": False}, {"op_rewrites": False}])
def test_mobilenet_block_trains_in_ort_like_eager(options: dict[str, bool]) -> None:
    eager, ort = fit_both(MobileBlock, image_loader, 6, strategy=lightning_ort.ORTStrategy(**options))
    assert_ort_ran(ort, 6)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
