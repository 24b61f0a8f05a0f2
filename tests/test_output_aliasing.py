"""An ATen node whose output shares memory with its input (a view, or the input itself): ORT reuses
the input's memory after the node, so such outputs must be copies (extensions._owned_outputs)."""

from __future__ import annotations

import torch
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import MLP, mlp_loader
from torch import nn

from lightning_ort import ORTStrategy


class DiagonalOfOne(MLP):
    """ORT exports ``diagonal`` as an ATen node; of a (B, 1, 1) tensor it is a contiguous view. Without
    the copy, the losses were off by 1e31 at the first steps."""

    def __init__(self) -> None:
        super().__init__()
        self.one = nn.Linear(16, 1)
        self.more = nn.Linear(1, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        diagonal = self.one(x).unsqueeze(-1).diagonal(dim1=-2, dim2=-1)
        return self.head(torch.tanh(self.more(diagonal)) * torch.relu(self.more(diagonal * 3)) + diagonal)


def test_an_output_that_is_a_view_of_the_input_trains_like_eager() -> None:
    eager, ort = fit_both(DiagonalOfOne, mlp_loader, 6, strategy=ORTStrategy(fallback="raise"))
    assert_ort_ran(ort, 6)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
