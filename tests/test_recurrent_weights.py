"""An ``nn.LSTM``/``nn.GRU`` with frozen weights after trained layers crashed the process in ORT's
backward (SIGSEGV); such graphs are refused with the reason and train in PyTorch like eager."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import SequenceClassifier, varying_sequences
from torch import nn

from lightning_ort import ORTStrategy

STEPS = 3


class Tagger(SequenceClassifier):
    """A trained input layer, then an LSTM or GRU of which ``freeze`` freezes some weights."""

    def __init__(self, cell: str, freeze: Callable[[nn.Module], object], input_trained: bool = True) -> None:
        super().__init__()
        self.input = nn.Linear(8, 8)
        self.input.requires_grad_(input_trained)
        self.rnn = getattr(nn, cell)(8, 6, batch_first=True)
        freeze(self.rnn)
        self.head = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.input(x))[0].mean(1))


FREEZES = {
    "weight_ih": lambda rnn: rnn.weight_ih_l0.requires_grad_(False),
    "whole-layer": lambda rnn: rnn.requires_grad_(False),
}


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
@pytest.mark.parametrize("freeze", list(FREEZES))
def test_frozen_recurrent_weights_after_trained_layers_fall_back_with_the_reason(cell: str, freeze: str) -> None:
    eager, ort = fit_both(
        lambda: Tagger(cell, FREEZES[freeze]), varying_sequences, STEPS, strategy=ORTStrategy(fullgraph=True)
    )
    (report,) = ort.reports
    assert report.fallback_reason is not None and f"nn.{cell}" in report.fallback_reason
    assert "frozen" in report.fallback_reason and "ORTStrategy(modules=" in report.fallback_reason
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def _freeze_biases(rnn: nn.Module) -> None:
    rnn.bias_ih_l0.requires_grad_(False)
    rnn.bias_hh_l0.requires_grad_(False)


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
@pytest.mark.parametrize("case", ["no-gradient-through-it", "frozen-biases"])
def test_frozen_recurrent_layers_ort_can_train_still_train_in_ort(cell: str, case: str) -> None:
    if case == "frozen-biases":
        make = lambda: Tagger(cell, _freeze_biases)  # noqa: E731
    else:
        make = lambda: Tagger(cell, FREEZES["whole-layer"], input_trained=False)  # noqa: E731
    eager, ort = fit_both(make, varying_sequences, STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
