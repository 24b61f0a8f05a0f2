"""``Tensor.mT``, ``mH`` and ``adjoint()`` train in ORT (matrix_transposes.py): torch 2.13 cannot
export them, and models using them fell back to PyTorch."""

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
