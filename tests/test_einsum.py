"""``torch.einsum`` and ``torch.outer`` train in ORT like eager (einsum.py). Before, every equation
ORT's export did not turn into MatMuls (an ellipsis, an implicit output, one operand, a repeated
label) became an ONNX ``Einsum`` node without a gradient, and the model fell back to PyTorch. The
outer product trained wrongly on the way, until ORT's shape inference knew the ATen node's shape."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base, varying_sequences
from torch import nn

from lightning_ort import ORTStrategy

STEPS = 4


class Einsum(Base):
    """Attention-like scores, a reduction written with ``einsum``, or an ``outer``."""

    def __init__(self, equation: str) -> None:
        super().__init__()
        self.equation = equation
        self.query, self.key = nn.Linear(8, 8), nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 8))
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.query(x), self.key(x)
        if self.equation == "outer":
            mixed = x + torch.outer(q.mean((0, 1)), self.scale).sum(0)
        elif "," in self.equation:
            scores = torch.einsum(self.equation, q, k).softmax(-1)
            mixed = scores @ x
        else:
            mixed = x + torch.einsum(self.equation, torch.tanh(q)).unsqueeze(-1)
        return self.head(mixed.mean(1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


@pytest.mark.parametrize("equation", ["...ld,...md->...lm", "bld,bmd", "bld->bl", "outer"])
@pytest.mark.parametrize("op_rewrites", [True, False])
def test_einsum_trains_in_ort_like_eager(equation: str, op_rewrites: bool) -> None:
    eager, ort = fit_both(
        lambda: Einsum(equation), varying_sequences, STEPS, strategy=ORTStrategy(op_rewrites=op_rewrites)
    )
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
