"""A module ORT runs whose input requires grad (``ORTStrategy(modules=["head"])`` with the head fed by a
backbone PyTorch runs) trains in ORT like eager when that input goes straight into a layer whose torch code
checks its sizes: BatchNorm's batch-size check, GroupNorm's and InstanceNorm's, an RNN's ``check_input``,
``F.affine_grid``'s. ORT exports with leaf copies of the call's inputs; the export's checks did not take one
that requires grad for the trace's input, so torch's own size checks on it were refused as Python control
flow on tensor data (``value_traces.py``). A branch of the user's own on such an input's data is still
refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base, sequence_batches
from torch import nn
from torch.utils.data import DataLoader

from lightning_ort import ORTStrategy

STEPS = 4


class BackboneHead(Base):
    """``backbone`` in PyTorch, then ``head`` (the module ORT runs), then the mean over all but the batch."""

    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.head(self.backbone(x))
        return out.flatten(2).mean(2) if out.dim() > 2 else out

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


class Channels(nn.Module):
    """(batch, length, 8) sequences as (batch, 8, length, 1) images through a convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.transpose(1, 2).unsqueeze(-1))


class Pooled(nn.Module):
    """``layer``, then a linear head over its channels (pooled over positions)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer, self.linear = layer, nn.Linear(8, 3)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(self.layer(h).flatten(2).mean(2))


class RecurrentHead(nn.Module):
    """A batch-first ``rnn`` over the features, and a linear head over its outputs and final state."""

    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn, self.linear = rnn, nn.Linear(24, 3)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out, final = self.rnn(h)
        final = final[0] if isinstance(final, tuple) else final
        return self.linear(torch.cat([out.mean(1), final[-1]], 1))


class Grid(nn.Module):
    """A spatial transformer's grid generator: the 4 x 4 sampling grid of ``theta`` (computed in PyTorch)."""

    def forward(self, theta: torch.Tensor) -> torch.Tensor:
        return F.affine_grid(theta, [theta.shape[0], 1, 4, 4], align_corners=False)


class SpatialTransformer(Base):
    """A localisation layer computes ``theta`` in PyTorch, ``grid`` (ORT) its grid, PyTorch samples the images."""

    def __init__(self) -> None:
        super().__init__()
        self.localisation, self.grid, self.linear = nn.Linear(8, 6), Grid(), nn.Linear(8, 3)
        self.register_buffer("identity", torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        images = x.transpose(1, 2).unsqueeze(-1).expand(-1, -1, -1, 3)
        theta = self.localisation(x.mean(1)).view(-1, 2, 3) * 0.2 + self.identity
        sampled = F.grid_sample(images, self.grid(theta), align_corners=False)
        return self.linear(sampled.mean((2, 3)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


def features() -> DataLoader:
    """(batch, 8) features of varying batch size."""
    return DataLoader([(x.mean(1), y) for x, y in sequences()], batch_size=None)


def sequences() -> DataLoader:
    return sequence_batches([(4, 6), (2, 9), (3, 5), (4, 7)], 8)


MODELS: dict[str, tuple[Callable[[], Base], Callable[[], DataLoader]]] = {
    "batch-norm-1d": (
        lambda: BackboneHead(nn.Linear(8, 16), nn.Sequential(nn.BatchNorm1d(16), nn.Linear(16, 3))),
        features,
    ),
    "batch-norm-2d": (lambda: BackboneHead(Channels(), Pooled(nn.BatchNorm2d(8))), sequences),
    "group-norm": (lambda: BackboneHead(Channels(), Pooled(nn.GroupNorm(2, 8))), sequences),
    "instance-norm": (lambda: BackboneHead(Channels(), Pooled(nn.InstanceNorm2d(8, affine=True))), sequences),
    "gru": (lambda: BackboneHead(nn.Linear(8, 8), RecurrentHead(nn.GRU(8, 12, batch_first=True))), sequences),
    "lstm": (lambda: BackboneHead(nn.Linear(8, 8), RecurrentHead(nn.LSTM(8, 12, batch_first=True))), sequences),
    "rnn": (lambda: BackboneHead(nn.Linear(8, 8), RecurrentHead(nn.RNN(8, 12, batch_first=True))), sequences),
}


@pytest.mark.parametrize(("make_model", "loader"), MODELS.values(), ids=MODELS.keys())
def test_head_fed_by_a_backbone_trains_in_ort_like_eager(
    make_model: Callable[[], Base], loader: Callable[[], DataLoader]
) -> None:
    strategy = ORTStrategy(modules=["head"], fallback="raise")
    eager, ort = fit_both(make_model, loader, STEPS, strategy=strategy)
    assert_ort_ran(ort, STEPS)
    assert [report.name for report in ort.reports] == ["head"]
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)  # the backbone's weights too: the gradient ORT gave the head's input


def test_affine_grid_of_a_learnt_theta_trains_in_ort_like_eager() -> None:
    eager, ort = fit_both(
        SpatialTransformer, sequences, STEPS, strategy=ORTStrategy(modules=["grid"], fallback="raise")
    )
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class ValueBranch(nn.Module):
    """A branch of the user's on ``condition(self, h)``, ``h`` the input (which requires grad)."""

    def __init__(self, condition: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.condition, self.linear = condition, nn.Linear(16, 3)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.condition(self, h):
            h = h * 2
        return self.linear(h)


def _branching(condition: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> Callable[[], Base]:
    return lambda: BackboneHead(nn.Linear(8, 16), ValueBranch(condition))


def test_a_branch_on_data_computed_by_the_module_is_still_refused() -> None:
    """A branch on what the module's own layer computes from the input: the export would freeze it."""
    make = _branching(lambda module, h: module.linear(h).sum() > 0)
    eager, ort = fit_both(make, features, STEPS, strategy=ORTStrategy(modules=["head"], fullgraph=True))
    (head,) = ort.reports
    assert head.fallback_reason is not None, head
    assert "control flow or values that depend on tensor data" in head.fallback_reason
    assert f"{__file__}:" in head.fallback_reason  # the user's line, not torch's nor lightning_ort's
    assert head.ort_calls == 0
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


@pytest.mark.parametrize(
    "condition",
    [lambda module, h: h.shape[0] > 3, lambda module, h: h[:, 0].sum() > 0],
    ids=["size", "values"],
)
def test_a_branch_on_an_input_that_requires_grad_is_guarded(
    condition: Callable[[nn.Module, torch.Tensor], torch.Tensor],
) -> None:
    """A branch on the input's sizes or on its values alone is checked before every call (as for an input
    without gradient): ORT exports again when it goes the other way, and each step trains like eager."""
    eager, ort = fit_both(
        _branching(condition), features, STEPS, strategy=ORTStrategy(modules=["head"], fallback="raise")
    )
    assert_ort_ran(ort, STEPS)
    (head,) = ort.reports
    assert head.size_exports >= 2, head  # the branch went the other way (and ORT exported again)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
