"""Parameters that require grad but reach the outputs by no path a gradient takes get ``None``
gradients in ORT, as in eager (gradient_paths.py); ORT refused them and the module fell back."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base, mlp_loader
from torch import nn


class Unreached(Base):
    """A threshold parameter used only in a comparison, or a teacher whose output is detached."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.body, self.head = nn.Linear(16, 16), nn.Linear(16, 3)
        self.threshold = nn.Parameter(torch.linspace(-1, 1, 16))
        self.teacher = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.body(x))
        if self.how == "comparison":
            h = h.masked_fill(h > self.threshold, 0.0)
        else:
            h = h + 0.1 * self.teacher(x).detach()
        return self.head(h)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # weight decay moves a parameter with a zero gradient, and skips one whose gradient is None
        return torch.optim.AdamW(self.parameters(), lr=0.01, weight_decay=0.1)


@pytest.mark.parametrize("how", ["comparison", "detached-teacher"])
def test_parameters_without_a_gradient_path_get_none(how: str) -> None:
    eager, ort = fit_both(lambda: Unreached(how), mlp_loader, 5)
    assert_ort_ran(ort, 5)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    unreached = ort.model.threshold if how == "comparison" else ort.model.teacher.weight
    assert unreached.grad is None
