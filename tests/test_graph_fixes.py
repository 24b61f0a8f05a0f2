"""Common models whose ONNX graph ORT could not build train in ORT like eager (losses.py, ...)."""

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


def flat_batches(sizes: tuple[int, ...] = (4, 2, 8, 1, 5), classes: int = 5) -> DataLoader:
    """(x, y) batches of 8 features and class indices, of varying batch sizes."""
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(b, 8, generator=g), torch.randint(0, classes, (b,), generator=g)) for b in sizes]
    return DataLoader(batches, batch_size=None)


class Classifier(Base):
    """A linear classifier over 2-D logits whose forward returns ``loss(logits, y)`` (so ORT runs it)."""

    def __init__(self, loss: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.loss = loss
        self.hidden, self.head = nn.Linear(8, 8), nn.Linear(8, 5)
        self.register_buffer("class_weight", torch.tensor([1.0, 2.0, 0.5, 1.5, 0.2]))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss(self, self.head(torch.tanh(self.hidden(x))), y)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(*batch)


def _soft(z: torch.Tensor) -> torch.Tensor:
    return torch.softmax(2 * z.detach(), -1)


LOSSES: dict[str, Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "nll-log-softmax": lambda m, z, y: F.nll_loss(F.log_softmax(z, 1), y),
    "nll-log-softmax-weight": lambda m, z, y: F.nll_loss(F.log_softmax(z, -1), y, weight=m.class_weight),
    "nll-log-softmax-ignore-index": lambda m, z, y: F.nll_loss(F.log_softmax(z, 1), y, ignore_index=2),
    "nll-log-softmax-sum": lambda m, z, y: F.nll_loss(F.log_softmax(z, 1), y, reduction="sum"),
    "cross-entropy-probabilities": lambda m, z, y: F.cross_entropy(z, _soft(z)),
    "cross-entropy-probabilities-weight": lambda m, z, y: F.cross_entropy(z, _soft(z), weight=m.class_weight),
    "cross-entropy-probabilities-smoothing": lambda m, z, y: F.cross_entropy(z, _soft(z), label_smoothing=0.1),
    "cross-entropy-probabilities-sum": lambda m, z, y: F.cross_entropy(z, _soft(z), reduction="sum"),
    "cross-entropy-probabilities-3d-weight": lambda m, z, y: F.cross_entropy(
        torch.stack([z, 2 * z], -1), torch.stack([_soft(z), _soft(-z)], -1), weight=m.class_weight
    ),
    "cross-entropy-one-hot": lambda m, z, y: F.cross_entropy(z, F.one_hot(y, 5).float()),
    "cross-entropy-indices": lambda m, z, y: F.cross_entropy(z, y, weight=m.class_weight),
    "cross-entropy-indices-smoothing": lambda m, z, y: F.cross_entropy(z, y, label_smoothing=0.1),
    "cross-entropy-indices-smoothing-weight-ignore": lambda m, z, y: F.cross_entropy(
        z, y, weight=m.class_weight, ignore_index=2, label_smoothing=0.2
    ),
    "cross-entropy-indices-smoothing-sum-ignore": lambda m, z, y: F.cross_entropy(
        z, y, ignore_index=1, label_smoothing=0.2, reduction="sum"
    ),
    "cross-entropy-indices-smoothing-3d": lambda m, z, y: F.cross_entropy(
        torch.stack([z, 2 * z], -1), torch.stack([y, y.flip(0)], -1), weight=m.class_weight, label_smoothing=0.1
    ),
}


@pytest.mark.parametrize("loss", LOSSES.values(), ids=LOSSES.keys())
def test_loss_trains_in_ort_like_eager(loss: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    eager, ort = fit_both(lambda: Classifier(loss), flat_batches, 5)
    assert_ort_ran(ort, 5)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class CountingOutput(Base):
    """A forward returning a Python number next to its tensor (a common ``{"n_items": 3}`` pattern)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        return {"h": self.layer(x), "n_items": 3}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0])["h"], batch[1])


def test_python_number_output_is_refused_with_the_fix() -> None:
    eager, ort = fit_both(CountingOutput, flat_batches, 5, strategy=ORTStrategy(fullgraph=True))
    (report,) = ort.reports
    assert report.fallback_reason is not None
    assert "returns a Python number (int, float or bool) among its outputs" in report.fallback_reason
    assert "compute the number outside forward" in report.fallback_reason
    assert "control flow" not in report.fallback_reason
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class Sequence(Base):
    """``layer`` over a linear projection of the sequence, then a classifier over the mean position."""

    def __init__(self, layer: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.layer = layer
        self.inner, self.head = nn.Linear(8, 8), nn.Linear(8, 3)
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True, add_zero_attn=True)
        self.attention_bias_kv = nn.MultiheadAttention(8, 2, add_bias_kv=True, add_zero_attn=True)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.inner(x)
        return F.cross_entropy(self.head((h + self.layer(self, h)).mean(1)), y)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(*batch)


def _ones_column_twice(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """Homogeneous coordinates on both sides, from one constant fill (as torch.cdist(h, h) builds)."""
    ones = torch.ones(*h.shape[:2], 1)
    return torch.cat([h, ones], -1)[..., 1:] * torch.cat([ones, torch.tanh(h)], -1)[..., :-1]


def _time_first(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
    t = h.transpose(0, 1)
    return m.attention_bias_kv(t, t, t, need_weights=False)[0].transpose(0, 1)


LAYERS: dict[str, Callable[[nn.Module, torch.Tensor], torch.Tensor]] = {
    "attention-add-zero-attn": lambda m, h: m.attention(h, h, h, need_weights=False)[0],
    "attention-add-zero-attn-weights": lambda m, h: m.attention(h, h, h)[0],
    "attention-add-zero-attn-bias-kv": _time_first,
    "ones-column-twice": _ones_column_twice,
    "zeros-between": lambda m, h: torch.cat([h, torch.zeros(*h.shape[:2], 2), h.flip(1)], -1)[..., 5:13],
    "cdist": lambda m, h: torch.cdist(h, 2 * h + 1).mean(-1, keepdim=True),
}


@pytest.mark.parametrize("layer", LAYERS.values(), ids=LAYERS.keys())
def test_constant_fill_concat_trains_in_ort_like_eager(
    layer: Callable[[nn.Module, torch.Tensor], torch.Tensor],
) -> None:
    eager, ort = fit_both(lambda: Sequence(layer), lambda: sequence_batches([(4, 6), (2, 9), (3, 1), (4, 6)], 8), 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


@pytest.mark.parametrize("mode", ["use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist"])
def test_cdist_to_itself_trains_in_ort_like_eager(mode: str) -> None:
    """Zero distances (each point to itself): eager's gradient there is 0, the exported formula's was
    NaN; distances.py runs torch's own cdist, below and above the 25 points where eager switches to
    matrix products."""

    def layer(m: nn.Module, h: torch.Tensor) -> torch.Tensor:
        return torch.cdist(h, h, compute_mode=mode).mean(-1, keepdim=True)

    eager, ort = fit_both(lambda: Sequence(layer), lambda: sequence_batches([(4, 26), (2, 30), (3, 7), (4, 26)], 8), 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
