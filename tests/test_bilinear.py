"""``nn.Bilinear`` trains in ORT like eager (bilinear.py); torch has no ONNX export for it, and every
module with one fell back to PyTorch."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import SequenceClassifier, varying_sequences
from torch import nn

STEPS = 4


class BilinearHead(SequenceClassifier):
    """An ``nn.Bilinear`` between two projections of the sequence (one of them detached, optionally)."""

    def __init__(self, bias: bool, detached: bool) -> None:
        super().__init__()
        self.left, self.right = nn.Linear(8, 5), nn.Linear(8, 6)
        self.bilinear = nn.Bilinear(5, 6, 4, bias=bias)
        self.head = nn.Linear(4, 3)
        self.detached = detached

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        right = self.right(x)
        right = right.detach() if self.detached else right
        return self.head(torch.tanh(self.bilinear(self.left(x), right)).mean(1))


@pytest.mark.parametrize(("bias", "detached"), [(True, False), (False, False), (True, True)])
def test_bilinear_trains_in_ort_like_eager(bias: bool, detached: bool) -> None:
    eager, ort = fit_both(lambda: BilinearHead(bias, detached), varying_sequences, STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
