"""torch.cdist, F.pairwise_distance and F.cosine_similarity train in ORT like eager (distances.py):
torch's export had NaN forwards for p != 2 and NaN gradients at a zero distance or a zero vector."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Between, sequence_batches
from torch.utils.data import DataLoader


def sequences() -> DataLoader:
    # odd lengths: flipped, the middle position is at distance 0 from itself
    return sequence_batches([(4, 6), (2, 9), (3, 1), (4, 5)], 8)


def _scaled(h: torch.Tensor, distances: torch.Tensor) -> torch.Tensor:
    return h * torch.tanh(distances.mean(-1, keepdim=True))


FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "cdist-p1": lambda h: _scaled(h, torch.cdist(h, h + 1, p=1.0)),
    "cdist-p3": lambda h: _scaled(h, torch.cdist(h, h.flip(1), p=3.0)),
    "cdist-p-fractional": lambda h: _scaled(h, torch.cdist(h, h + 0.5, p=1.5)),
    "cdist-p-inf": lambda h: _scaled(h, torch.cdist(h, h + 1, p=float("inf"))),
    "cdist-p2-zero-distance": lambda h: _scaled(h, torch.cdist(h, h.flip(1))),
    "cdist-x1-detached": lambda h: _scaled(h, torch.cdist(h.detach(), h + 1, p=1.0)),
    "cdist-x2-detached": lambda h: _scaled(h, torch.cdist(h, h.detach() + 1, p=1.0)),
    "pairwise-distance-p1": lambda h: h * F.pairwise_distance(h, h.flip(1) + 0.5, p=1.0).unsqueeze(-1),
    "pairwise-distance-p3-keepdim": lambda h: h * F.pairwise_distance(h, -h, p=3.0, keepdim=True),
    # positions whose first feature is <= 0 compared with a zero vector (masked padding)
    "cosine-zero-vectors": lambda h: h * F.cosine_similarity(h, h.flip(1) * (h[..., :1] > 0), dim=-1).unsqueeze(-1),
    "cosine-broadcast": lambda h: h * F.cosine_similarity(h, h.mean(1, keepdim=True), dim=-1).unsqueeze(-1),
    "cosine-over-positions-x2-detached": lambda h: h * F.cosine_similarity(h, h.detach().flip(1), dim=1).unsqueeze(1),
}


@pytest.mark.parametrize("function", FUNCTIONS.values(), ids=FUNCTIONS.keys())
def test_distance_trains_in_ort_like_eager(function: Callable[[torch.Tensor], torch.Tensor]) -> None:
    eager, ort = fit_both(lambda: Between(function), sequences, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
