"""Every upsampling mode of ``F.interpolate`` trains in ORT like eager (upsample.py), with scale factors
float32 cannot hold (0.7, 1.3, 1/3) and ones that are not the ratio of the sizes (1.7 on 9 pixels)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base
from torch import nn
from torch.utils.data import DataLoader

import lightning_ort

CONVOLUTIONS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


class Upsampler(Base):
    """A convolution, upsampling, and a head that weighs every output position differently."""

    def __init__(self, dims: int, **interpolate: Any) -> None:
        super().__init__()
        self.conv = CONVOLUTIONS[dims](2, 4, 3, padding=1)
        self.interpolate = interpolate
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.interpolate(self.conv(x), **self.interpolate)
        positions = torch.arange(h[0, 0].numel(), dtype=h.dtype).reshape(h.shape[2:]).sin()
        return self.head((h * positions).flatten(2).mean(2))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


def loader(dims: int, size: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(batch, 2, *[size] * dims, generator=g), torch.randint(0, 3, (batch,), generator=g))
        for batch in (4, 2, 3, 4)
    ]
    return DataLoader(batches, batch_size=None)


CASES = [
    ("nearest", 2, {}),
    ("nearest-exact", 2, {}),
    ("bilinear", 2, {"align_corners": False}),
    ("bilinear", 2, {"align_corners": True}),
    ("bicubic", 2, {"align_corners": False}),
    ("linear", 1, {"align_corners": False}),
    ("trilinear", 3, {"align_corners": False}),
    ("nearest", 3, {}),
]


@pytest.mark.parametrize(
    ("mode", "dims", "extra"), CASES, ids=[f"{mode}-{dims}d-{extra}" for mode, dims, extra in CASES]
)
@pytest.mark.parametrize(("scale", "size"), [(2.0, 6), (0.7, 10), (1.7, 9), (1 / 3, 9), (None, 6)])
def test_upsampling_trains_like_eager(
    mode: str, dims: int, extra: dict[str, Any], scale: float | None, size: int
) -> None:
    interpolate = {"mode": mode, **extra, **({"scale_factor": scale} if scale else {"size": 11})}
    eager, ort = fit_both(lambda: Upsampler(dims, **interpolate), lambda: loader(dims, size), 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_upsampling_trains_like_eager_without_op_rewrites() -> None:
    interpolate = {"mode": "bilinear", "align_corners": False, "scale_factor": 0.7}
    strategy = lightning_ort.ORTStrategy(op_rewrites=False)
    eager, ort = fit_both(lambda: Upsampler(2, **interpolate), lambda: loader(2, 10), 4, strategy=strategy)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class SegmentationHead(Base):
    """Pools, then upsamples back to the input's own size (``size=x.shape[-2:]``), per pixel classes."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.head = nn.Conv2d(4, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.head(F.max_pool2d(torch.relu(self.conv(x)), 2))
        align = {} if self.mode == "nearest" else {"align_corners": False}
        return F.interpolate(logits, size=x.shape[-2:], mode=self.mode, **align)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


def images(sizes: list[tuple[int, int]]) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(batch, 2, size, size, generator=g), torch.randint(0, 3, (batch, size, size), generator=g))
        for batch, size in sizes
    ]
    return DataLoader(batches, batch_size=None)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_upsampling_to_the_input_size_trains_in_ort(mode: str) -> None:
    # ORT's shape inference put the sizes read from x.shape into the graph's annotations as sympy
    # symbols; it failed, and the graph build after it ("type inference failed"): the model fell back
    eager, ort = fit_both(lambda: SegmentationHead(mode), lambda: images([(4, 8), (3, 12), (2, 10), (1, 8)]), 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
