"""Iterating over a tensor (``q, k, v = qkv``) trains in ORT over a dimension of constant size, and is
refused with the reason over one whose size can change between batches."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base, sequence_batches
from torch import nn
from torch.utils.data import DataLoader

import lightning_ort


class Classifier(Base):
    """Classifies (batch, length, 16) sequences into 3 classes with its ``forward``."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


class Probe(Classifier):
    """A projection to 8 features and a head around a ``forward`` that uses the positions as ``how`` says."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.inner, self.head = nn.Linear(16, 8), nn.Linear(8, 3)


class ViTAttention(Classifier):
    """ViT/DeiT-style attention: the packed projection's q, k and v taken apart by iterating over it."""

    lr = 0.01

    def __init__(self, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(16, 48)
        self.proj = nn.Linear(16, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, channels = x.shape
        qkv = self.qkv(x).reshape(batch, length, 3, self.heads, 16 // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv
        attention = (q @ k.transpose(-2, -1) * (16 // self.heads) ** -0.5).softmax(dim=-1)
        out = self.proj((attention @ v).transpose(1, 2).reshape(batch, length, channels))
        return self.head(out.mean(1))


class Stacked(Classifier):
    """Two projections stacked, then iterated over (a constant count of two)."""

    def __init__(self) -> None:
        super().__init__()
        self.left, self.right, self.head = nn.Linear(16, 8), nn.Linear(16, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        left, right = torch.stack([self.left(x), self.right(x)]).contiguous()
        return self.head((left * right.sigmoid()).mean(1))


class OverRows(Probe):
    """Iterates over a dimension of the input: ``how`` is how the parts reach the result."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inner(x)
        if self.how == "weighted-rows":  # each row of the batch weighted by its position
            mixed = sum((i + 1) * row.mean(0) for i, row in enumerate(h))
            return self.head(h.mean(1) + mixed)
        if self.how == "weighted-positions":  # each position of the sequence weighted by its index
            return self.head(sum((i + 1) * step for i, step in enumerate(h.transpose(0, 1))))
        # only the count of positions reaches the result: the graph would hold no part at all
        count = sum(1 for _ in h.transpose(0, 1))
        return self.head(h.mean(1) * count)


def varying_batches() -> DataLoader:
    """Batches of varying size and length, smaller and larger than the first (the one exported)."""
    return sequence_batches([(4, 6), (2, 6), (6, 3), (3, 9), (1, 1)], 16)


@pytest.mark.parametrize("make_model", [ViTAttention, Stacked], ids=["vit-attention", "stacked"])
def test_iteration_over_a_constant_size_trains_in_ort(make_model: Any) -> None:
    eager, ort = fit_both(make_model, varying_batches, 5, strategy=lightning_ort.ORTStrategy())
    assert_ort_ran(ort, 5)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


@pytest.mark.parametrize("uses", ["weighted-rows", "weighted-positions", "count-only"])
def test_iteration_over_a_varying_size_is_refused(uses: str) -> None:
    """Without the refusal, ORT's Split failed on the second batch when some part was used (a fallback
    after one step), and ``count-only`` trained silently wrongly: the count stayed the first batch's."""
    eager, ort = fit_both(
        lambda: OverRows(uses), varying_batches, 5, strategy=lightning_ort.ORTStrategy(fullgraph=True)
    )
    (report,) = ort.reports
    assert report.fallback_reason is not None and "iterates over a tensor" in report.fallback_reason
    assert "test_tensor_iteration.py" in report.fallback_reason
    assert report.ort_calls == 0
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class ScaledByWidth(Classifier):
    """minGPT-style attention: ``B, T, C = x.size()``, heads from ``view(B, T, n_head, C // n_head)`` and
    the scale ``1.0 / math.sqrt(k.size(-1))``, a Python number read from a traced size. ``scale_from``
    ``"sequence"`` reads the sequence length instead, which varies."""

    lr = 0.01

    def __init__(self, scale_from: str) -> None:
        super().__init__()
        self.scale_from = scale_from
        self.embed, self.ln = nn.Linear(16, 16), nn.LayerNorm(16)
        self.c_attn, self.head = nn.Linear(16, 48), nn.Linear(16, 3)
        self.n_head = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln(self.embed(x))
        batch, length, channels = x.size()
        q, k, v = self.c_attn(x).split(channels, dim=2)
        q, k, v = (t.view(batch, length, self.n_head, channels // self.n_head).transpose(1, 2) for t in (q, k, v))
        sizes = {"head-width": k.size(-1), "head-arithmetic": channels // self.n_head, "sequence": k.size(-2)}
        size = sizes[self.scale_from]
        attention = (q @ k.transpose(-2, -1) * (1.0 / math.sqrt(size))).softmax(dim=-1)
        return self.head((attention @ v).transpose(1, 2).reshape(batch, length, channels).mean(1))


@pytest.mark.parametrize("scale_from", ["head-width", "head-arithmetic"])
def test_a_python_number_from_a_fixed_size_trains_in_ort(scale_from: str) -> None:
    """``math.sqrt(k.size(-1))`` and ``math.sqrt(C // n_head)`` (C the width of a linear layer's output)."""
    eager, ort = fit_both(lambda: ScaledByWidth(scale_from), varying_batches, 5, strategy=lightning_ort.ORTStrategy())
    assert_ort_ran(ort, 5)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_a_python_number_from_a_varying_size_is_still_refused() -> None:
    eager, ort = fit_both(
        lambda: ScaledByWidth("sequence"), varying_batches, 5, strategy=lightning_ort.ORTStrategy(fullgraph=True)
    )
    (report,) = ort.reports
    assert report.fallback_reason is not None and "Converting a tensor to a Python float" in report.fallback_reason
    assert "test_tensor_iteration.py" in report.fallback_reason  # the line converting, not lightning_ort's
    assert report.ort_calls == 0
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class SplitCount(Probe):
    """Splits the positions of a sequence: ``how`` is which split, and how its parts reach the result."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inner(x)
        if self.how == "steps-used":  # an RNN-style loop over the positions: every part reaches the graph
            state = torch.zeros_like(h[:, 0])
            for step in h.unbind(1):
                state = torch.tanh(step + state)
            return self.head(state)
        if self.how == "unbind-len":
            count = len(h.unbind(1))
        elif self.how == "split-enumerate":
            count = max(i + 1 for i, _ in enumerate(torch.split(h, 1, dim=1)))
        else:  # "constant-size": the parts of a dimension a view sets to 2
            count = len(h.view(h.shape[0], h.shape[1], 2, 4).unbind(2))
        return self.head(h.mean(1) * count)


@pytest.mark.parametrize("how", ["unbind-len", "split-enumerate"])
def test_counting_the_parts_of_a_varying_split_is_refused(how: str) -> None:
    """The parts never reach the graph, so the split left it and nothing failed: before the refusal, the count
    stayed the first batch's and the losses left eager's from the first batch of another length on (1.890 against
    1.415 at the third step)."""
    eager, ort = fit_both(
        lambda: SplitCount(how), varying_batches, 5, strategy=lightning_ort.ORTStrategy(fullgraph=True)
    )
    (report,) = ort.reports
    assert report.fallback_reason is not None and "uses only the number of parts" in report.fallback_reason
    assert "test_tensor_iteration.py" in report.fallback_reason
    assert report.ort_calls == 0
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


@pytest.mark.parametrize(
    ("how", "batches"),
    [("constant-size", varying_batches), ("steps-used", lambda: sequence_batches([(4, 6), (2, 6), (5, 6)], 16))],
)
def test_splits_whose_count_cannot_change_unnoticed_train_in_ort(how: str, batches: Any) -> None:
    eager, ort = fit_both(lambda: SplitCount(how), batches, 3, strategy=lightning_ort.ORTStrategy())
    assert_ort_ran(ort, 3)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_a_used_split_of_a_varying_dimension_falls_back_with_the_reason() -> None:
    """ORT's ``Split`` fails on the first batch of another length; training goes on in PyTorch from there."""
    eager, ort = fit_both(
        lambda: SplitCount("steps-used"), varying_batches, 5, strategy=lightning_ort.ORTStrategy(fullgraph=True)
    )
    (report,) = ort.reports
    assert report.fallback_reason is not None and "splits a dimension whose size changed" in report.fallback_reason
    assert report.ort_calls == 2  # the two batches of the exported length
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class Windows(Probe):
    """Windows of 4 positions with a shorter last one (``split``), a number of parts read from the length
    (``tensor_split``), or the sequence tiled (``tile``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inner(x)
        if self.how == "split":
            parts = h.split(4, dim=1)
            return self.head(parts[0].mean(1) - 2 * parts[-1].mean(1))
        if self.how == "tensor_split":  # the number of parts follows the length
            parts = torch.tensor_split(h, h.shape[1] // 5 + 2, dim=1)
            return self.head(parts[-1].mean(1))
        return self.head(torch.tile(h, (1, 2, 1)).mean(1) + torch.tile(h, (2, 1)).mean(1))


def test_a_split_with_a_shorter_last_part_trains_in_ort() -> None:
    """torch's export gave every part the split size when it did not know the length (a length of 7 split
    by 4 failed in ORT, every call ran in PyTorch); lengths that keep the count of parts now train in ORT."""
    batches = lambda: sequence_batches([(4, 7), (4, 6), (2, 5), (3, 8)], 16)  # noqa: E731
    eager, ort = fit_both(lambda: Windows("split"), batches, 4, strategy=lightning_ort.ORTStrategy())
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_a_split_into_another_number_of_parts_still_fails_loudly() -> None:
    """A length of 11 needs three parts of 4, the graph has two: ORT's Split fails (the sizes no longer add up)
    instead of splitting into the wrong parts."""
    batches = lambda: sequence_batches([(4, 7), (4, 11), (2, 5)], 16)  # noqa: E731
    eager, ort = fit_both(lambda: Windows("split"), batches, 3, strategy=lightning_ort.ORTStrategy(fullgraph=True))
    (report,) = ort.reports
    assert report.fallback_reason is not None and report.ort_calls == 1
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_tensor_split_into_a_number_of_parts_from_the_length_is_refused() -> None:
    """The trace kept the first batch's number of parts: `parts[-1]` stayed the third part (weights 0.054 off
    after five steps)."""
    batches = lambda: sequence_batches([(4, 7), (4, 11), (2, 5), (3, 9), (2, 12)], 16)  # noqa: E731
    eager, ort = fit_both(
        lambda: Windows("tensor_split"), batches, 5, strategy=lightning_ort.ORTStrategy(fullgraph=True)
    )
    (report,) = ort.reports
    assert report.fallback_reason is not None
    assert "splits a tensor into a number of parts computed from its inputs" in report.fallback_reason
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_tile_trains_in_ort() -> None:
    """torch's export of `torch.tile` holds `If` nodes, on which ORT's gradient builder aborted the process."""
    eager, ort = fit_both(lambda: Windows("tile"), varying_batches, 4, strategy=lightning_ort.ORTStrategy())
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
