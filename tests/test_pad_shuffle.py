"""Reflect/replicate padding and pixel (un)shuffle train in ORT like eager (pad_shuffle.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base, image_loader
from torch import nn

LAYERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "reflect-2d": lambda h: F.pad(h, (1, 2, 2, 1), mode="reflect"),
    "replicate-2d": lambda h: F.pad(h, (2, 1, 0, 3), mode="replicate"),
    "reflect-1d": lambda h: F.pad(h.flatten(2), (3, 1), mode="reflect"),
    "replicate-3d": lambda h: F.pad(h.unsqueeze(2), (1, 1, 1, 1, 1, 0), mode="replicate"),
    "circular-2d": lambda h: F.pad(h, (1, 1, 1, 1), mode="circular"),
    "pixel-shuffle": lambda h: F.pixel_shuffle(h, 2),
    "pixel-unshuffle": lambda h: F.pixel_unshuffle(h[..., :8, :8], 2),
}


class Padded(Base):
    """A convolution, the layer, a head that weighs every position differently."""

    def __init__(self, layer: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.layer = layer
        self.head = nn.LazyLinear(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layer(self.conv(x))
        positions = torch.arange(h[0, 0].numel(), dtype=h.dtype).reshape(h.shape[2:]).cos()
        return self.head((h * positions).flatten(2).mean(2))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_trains_in_ort_like_eager(name: str) -> None:
    def make_model() -> Padded:
        model = Padded(LAYERS[name])
        model(torch.zeros(1, 3, 8, 8))  # materialize the lazy head before the twins are copied
        return model

    eager, ort = fit_both(make_model, image_loader, 6)
    assert_ort_ran(ort, 6)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
