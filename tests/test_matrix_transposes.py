"""``Tensor.mT``, ``mH``, ``adjoint()``, and ``permute`` / ``movedim`` over negative dimensions train in
ORT (matrix_transposes.py): torch 2.13 cannot export the first three, and exported the others with
negative numbers ORT rejects; models using them fell back to PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import SequenceClassifier, varying_sequences
from torch import nn


class Transposes(SequenceClassifier):
    """A bilinear map of the sequence with itself through one of the transposes, then a classifier."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.proj = nn.Linear(8, 8)
        self.mix = nn.Parameter(torch.randn(8, 8) * 0.3)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        if self.kind == "mT":
            scores = h @ h.mT
        elif self.kind == "mH":
            scores = h @ h.mH
        else:
            scores = h @ h.adjoint()
        mixed = F.softmax(scores, dim=-1) @ h @ self.mix.mT
        return self.head(mixed.mean(1))


@pytest.mark.parametrize("kind", ["mT", "mH", "adjoint"])
def test_matrix_transposes_train_in_ort_and_match_eager(kind: str) -> None:
    eager, ort = fit_both(lambda: Transposes(kind), varying_sequences, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


MOVES = {
    "permute": lambda h: h.permute(0, -1, 1).cumsum(-1).permute(0, 2, 1),
    "movedim": lambda h: h.movedim(-1, 0).cumsum(0).movedim(0, -1),
    "moveaxis-pairs": lambda h: torch.moveaxis(h, (-1, 0), (0, -1)).cumsum(1).moveaxis((0, -1), (-1, 0)),
}


class Moved(SequenceClassifier):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.proj = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(MOVES[self.kind](self.proj(x)).mean(1))


@pytest.mark.parametrize("kind", MOVES)
def test_dimensions_moved_by_negative_numbers_train_in_ort(kind: str) -> None:
    eager, ort = fit_both(lambda: Moved(kind), varying_sequences, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
