"""``nn.RNN`` trains in ORT like eager, on torch's kernels (rnn.py); before, ORT had no gradient for
``RNN`` and every model with one fell back to PyTorch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import SequenceClassifier, varying_sequences
from torch import nn

from lightning_ort import ORTStrategy

STEPS = 4


class Recurrent(SequenceClassifier):
    """An ``nn.RNN`` and a head over its outputs and final states, optionally from a learned state
    or after a frozen input layer (the input needs a gradient, the RNN's weights none)."""

    def __init__(self, learned_state: bool = False, frozen: bool = False, **rnn: Any) -> None:
        super().__init__()
        self.input = nn.Linear(8, 8)
        self.rnn = nn.RNN(8, 6, **rnn)
        self.rnn.requires_grad_(not frozen)
        self.batch_first = rnn.get("batch_first", False)
        states = rnn.get("num_layers", 1) * (2 if rnn.get("bidirectional") else 1)
        self.h0 = nn.Parameter(0.1 * torch.randn(states, 1, 6)) if learned_state else None
        self.head = nn.Linear(6 * (2 if rnn.get("bidirectional") else 1) + 6 * states, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.input(x if self.batch_first else x.transpose(0, 1))
        h0 = None if self.h0 is None else self.h0.expand(-1, x.shape[0 if self.batch_first else 1], -1).contiguous()
        out, final = self.rnn(x, h0)
        return self.head(torch.cat([out.mean(1 if self.batch_first else 0), final.transpose(0, 1).flatten(1)], 1))


@pytest.mark.parametrize(
    "rnn",
    [
        {},
        {"nonlinearity": "relu", "batch_first": True},
        {"num_layers": 2},
        {"bidirectional": True, "batch_first": True},
        {"bidirectional": True, "num_layers": 2, "bias": False},
        {"learned_state": True, "num_layers": 2},
        {"frozen": True, "bidirectional": True},
    ],
    ids=["tanh", "relu-batch-first", "2-layers", "bidirectional", "bidirectional-2-layers-no-bias", "learned-state",
         "frozen"],
)  # fmt: skip
def test_rnn_trains_in_ort_like_eager(rnn: dict[str, Any]) -> None:
    eager, ort = fit_both(lambda: Recurrent(**rnn), varying_sequences, STEPS, strategy=ORTStrategy(fallback="raise"))
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class Packed(SequenceClassifier):
    """A bidirectional LSTM over packed sequences whose lengths come from the batch (``x[..., 0] > -9``
    keeps them all: every sequence is its full length)."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn, self.head = nn.LSTM(8, 6, batch_first=True, bidirectional=True), nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lengths = (x[..., 0] > -9).sum(1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        _, (h, _) = self.rnn(packed)
        return self.head(torch.cat([h[-2], h[-1]], -1))


def test_packed_sequences_fall_back_with_the_reason() -> None:
    """ORT's own errors said nothing a user could act on (``vector::_M_range_check``)."""
    eager, ort = fit_both(Packed, varying_sequences, STEPS, strategy=ORTStrategy(fullgraph=True))
    (report,) = ort.reports
    assert report.fallback_reason is not None and "packs sequences for a recurrent layer" in report.fallback_reason
    assert "test_rnn.py" in report.fallback_reason and report.ort_calls == 0
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
