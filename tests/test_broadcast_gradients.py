"""Broadcasts whose sizes only the run reveals get their gradients summed back, as in eager.

ORT's symbolic shape inference merges two unknown dimensions that meet in a broadcast; a merged
dimension that is 1 at run time then got no reduction in ORT's gradient graph: silently wrong
gradients (shape_inference.py). A squeeze-and-excitation gate is the common case.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base, image_loader
from torch import nn
from torch.utils.data import DataLoader

import lightning_ort


class SqueezeExcitation(Base):
    """torchvision's SqueezeExcitation form: ``x * sigmoid(conv(relu(conv(adaptive_avg_pool2d(x, 1)))))``."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.squeeze = nn.Conv2d(8, 4, 1)
        self.excite = nn.Conv2d(4, 8, 1)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.stem(x)
        gate = torch.sigmoid(self.excite(F.relu(self.squeeze(F.adaptive_avg_pool2d(features, 1)))))
        return self.head((features * gate).mean((2, 3)))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


@pytest.mark.parametrize(
    "options",
    [{}, {"channels_last": False}, {"op_rewrites": False}],
    ids=["defaults", "standard-memory", "ort-kernels"],
)
def test_squeeze_excitation_gate_gets_summed_gradients(options: dict[str, bool]) -> None:
    eager, ort = fit_both(SqueezeExcitation, image_loader, 6, strategy=lightning_ort.ORTStrategy(**options))
    assert_ort_ran(ort, 6)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class TopTwoExperts(Base):
    """A mixture of experts that weighs each expert's output by its column of a one-hot gate matrix."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(8, 4)
        self.experts = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)])
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values, indices = torch.topk(self.router(x), 2, dim=-1)
        gates = (F.one_hot(indices, 4).to(x.dtype) * values.softmax(-1).unsqueeze(-1)).sum(1)
        mixed = sum(gates[:, e : e + 1] * expert(x) for e, expert in enumerate(self.experts))
        return self.head(mixed)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


def test_gate_columns_times_expert_outputs_get_summed_gradients() -> None:
    # ORT's inference merged the width of gates[:, e : e + 1] (a symbol: the one-hot's width is not
    # read) with the experts' 8 and wrote 8 over it: the slices' gradients were not summed back, the
    # router's came out wrong (or ORT's SliceGrad asked for 300 GB)
    g = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(batch, 8, generator=g), torch.randint(0, 3, (batch,), generator=g)) for batch in (6, 6, 5, 1)
    ]
    eager, ort = fit_both(TopTwoExperts, lambda: DataLoader(batches, batch_size=None), 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
