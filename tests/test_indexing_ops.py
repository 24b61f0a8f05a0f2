"""Indexing ops torch exports wrongly or untrainably for ORT train like eager, or fall back (indexing.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base, Between, sequence_batches
from torch import nn
from torch.utils.data import DataLoader

from lightning_ort import ORTStrategy

# repeated targets: 1 twice, 7 three times (4, 5 and 6 never)
INDEX = torch.tensor([0, 1, 1, 2, 7, 7, 7, 3])
REPEATS = torch.tensor([1, 2, 1, 1, 0, 1, 1, 1])
UNIQUE = torch.tensor([3, 1, 0, 2])


class FlippedBias(Between):
    """The inner layer's bias flipped (a parameter's static dimension) added to its output."""

    def __init__(self) -> None:
        super().__init__(torch.tanh)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inner(x)
        return self.head((h * self.inner.bias.flip(0)).mean(1))


def sequences() -> DataLoader:
    return sequence_batches([(4, 6), (2, 9), (3, 1), (4, 6)], 8)


def _features_first(h: torch.Tensor, function: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``function`` on (features, batch, length), back to (batch, length, features)."""
    return function(h.permute(2, 0, 1)).permute(1, 2, 0)


def _two_indices(h: torch.Tensor) -> torch.Tensor:
    rows = h.mean(1).T  # (features, batch)
    columns = torch.zeros(8, dtype=torch.long)
    return rows.index_put((INDEX, columns), torch.tanh(rows[:, 0]), accumulate=True).T.unsqueeze(1)


def _masked(h: torch.Tensor, value: torch.Tensor | float) -> torch.Tensor:
    """wav2vec2's ``hidden_states[~attention_mask] = 0`` / ``[mask_time_indices] = masked_spec_embed``."""
    h = h * 1
    h[h.detach().sum(-1) > 0] = value
    return h


FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "index-add-last-dim": lambda h: torch.zeros_like(h).index_add(-1, INDEX, torch.tanh(h)),
    "index-add-alpha": lambda h: h.index_add(2, INDEX, torch.tanh(h), alpha=0.5),
    "index-add-dim-0": lambda h: _features_first(h, lambda t: torch.zeros_like(t).index_add(0, INDEX, t)),
    "index-put-accumulate": lambda h: _features_first(
        h, lambda t: t.new_zeros(t.shape).index_put((INDEX,), torch.tanh(t), accumulate=True)
    ),
    "index-put-accumulate-broadcast": lambda h: _features_first(
        h, lambda t: t.index_put((INDEX,), t[:, :1], accumulate=True)
    ),
    # without accumulate (unique indices), torch's own export is kept
    "index-put-assign": lambda h: _features_first(h, lambda t: t.index_put((UNIQUE,), torch.tanh(t[:4]))),
    # self needs a gradient: ORT's scatter gradient zeroed it at the scattered positions
    "scatter-add": lambda h: h.scatter_add(-1, INDEX.expand_as(h), torch.tanh(h)),
    "scatter-reduce-sum": lambda h: h.scatter_reduce(-1, INDEX.expand_as(h), torch.tanh(h), "sum"),
    "flip-features": lambda h: h.flip(-1) * h,
    "flip-two-dims": lambda h: h.flip(1, 2) * h,
    # torch's export did not take the shift modulo the size: unrolled where it exceeds it (batch of 2, length 1)
    "roll-past-the-size": lambda h: h.roll(3, 0) * h + h.roll(-5, 1),
    "roll-two-dims": lambda h: h.roll((1, -2), (1, 2)) * h,
    "roll-flattened": lambda h: h.roll(7) * h,
    "repeat-interleave-zero": lambda h: h.repeat_interleave(REPEATS, dim=-1) * h,
    "repeat-interleave-flat": lambda h: h * h[:1, 0].repeat_interleave(REPEATS),
    # a boolean mask over the leading dimensions: torch's export broadcast it from the right (fell back)
    "masked-assignment-number": lambda h: _masked(h, 0.0),
    "masked-assignment-row": lambda h: _masked(h, h[0, 0].detach() * 0 + torch.linspace(-1, 1, 8)),
    "masked-assignment-learnt-row": lambda h: _masked(h, torch.tanh(h[0, 0])),
}


@pytest.mark.parametrize("function", FUNCTIONS.values(), ids=FUNCTIONS.keys())
def test_indexing_trains_in_ort_like_eager(function: Callable[[torch.Tensor], torch.Tensor]) -> None:
    eager, ort = fit_both(lambda: Between(function), sequences, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_flipped_parameter_trains_in_ort_like_eager() -> None:
    eager, ort = fit_both(FlippedBias, sequences, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


REFUSED: dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = {
    "index-put-two-indices": ("index_put", _two_indices),
    "scatter-reduce-amax": ("scatter_reduce", lambda h: h.scatter_reduce(-1, INDEX.expand_as(h), h, "amax")),
    "scatter-reduce-sum-without-self": (
        "scatter_reduce",
        lambda h: h.scatter_reduce(-1, INDEX.expand_as(h), torch.tanh(h), "sum", include_self=False),
    ),
}


@pytest.mark.parametrize("operator,function", REFUSED.values(), ids=REFUSED.keys())
def test_refused_indexing_falls_back_with_reason(
    operator: str, function: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    eager, ort = fit_both(lambda: Between(function), sequences, 4, strategy=ORTStrategy(fullgraph=True))
    reasons = [report.fallback_reason for report in ort.reports]
    assert reasons and all(reason is not None and operator in reason for reason in reasons), reasons
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class InterleavedPositions(Base):
    """Token embeddings times interleaved rotary-style frequencies (``repeat_interleave(2, dim=-1)``,
    GPT-J/ESM style): torch's export of that turned the trace's shared constant -1, the Embedding's
    ``padding_idx`` among others, into 1, and token 1 stopped getting gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding, self.head = nn.Embedding(10, 8), nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(ids)
        freqs = torch.arange(x.shape[1], dtype=torch.float32)[:, None] * torch.linspace(0.1, 1.0, 4)
        return self.head((x * freqs.repeat_interleave(2, dim=-1).cos()).mean(1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


def _tokens() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    batches = [
        (torch.randint(0, 10, (n, t), generator=generator), torch.randint(0, 3, (n,), generator=generator))
        for n, t in ((4, 6), (3, 9), (4, 5))
    ]
    return DataLoader(batches, batch_size=None)


def test_repeat_interleave_over_a_negative_dim_leaves_other_constants_alone() -> None:
    eager, ort = fit_both(InterleavedPositions, _tokens, max_steps=3)
    assert_ort_ran(ort, 3)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class ForegroundLoss(Base):
    """A box loss over the foreground only, as detection models compute it: two selections by one mask,
    combined. A batch without foreground (all False) aborted the process in ORT's backward."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form, self.boxes = form, nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, foreground: torch.Tensor) -> torch.Tensor:
        boxes = self.boxes(x)
        predicted, target = boxes[:, 1], boxes[:, 0]
        regularizer = (target**2).mean()
        if self.form == "difference":
            return ((predicted[foreground] - target[foreground]) ** 2).sum() + regularizer
        if self.form == "mse-to-input":
            return F.mse_loss(predicted[foreground], x[:, 0][foreground], reduction="sum") + regularizer
        out = torch.zeros_like(predicted)  # torchvision's generalized_box_iou_loss assigns this way
        out[foreground] = (predicted[foreground] - target[foreground]) * 2
        return (out**2).sum() + regularizer

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(*batch)


def _foregrounds() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    masks = [[1, 0, 1, 0, 1, 1], [0, 1, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0], [1, 0, 0, 1]]
    batches = [(torch.randn(len(mask), 4, generator=g), torch.tensor(mask).bool()) for mask in masks]
    return DataLoader(batches, batch_size=None)


@pytest.mark.parametrize("form", ["difference", "mse-to-input", "assigned"])
def test_foreground_loss_with_a_batch_without_foreground(form: str) -> None:
    eager, ort = fit_both(lambda: ForegroundLoss(form), _foregrounds, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
