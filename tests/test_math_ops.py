"""Math functions torch cannot export or ORT cannot differentiate train in ORT like eager (math_ops.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base, Between, sequence_batches
from torch import nn
from torch.utils.data import DataLoader


def sequences() -> DataLoader:
    return sequence_batches([(4, 6), (2, 9), (3, 1), (4, 6)], 8)


FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "atan": torch.atan,
    "expm1": lambda h: torch.expm1(h.clamp(max=2)),
    "trunc": lambda h: h * torch.trunc(3 * h),
    "sign": lambda h: h * torch.sign(h),
    "threshold": lambda h: F.threshold(h, 0.1, -0.5),
    "logsumexp": lambda h: torch.logsumexp(h, -1, keepdim=True),
    "logsumexp-reduced": lambda h: torch.logsumexp(h, dim=(0, 2)).unsqueeze(-1),
    "cumprod": lambda h: torch.cumprod(torch.sigmoid(h) + 0.5, 1),
    "cumprod-with-zeros": lambda h: torch.cumprod(F.relu(h), -1),
    "logcumsumexp": lambda h: torch.logcumsumexp(h, 1),
    # ORT dropped the gradient through Pow's exponent, silently
    "pow-scalar-base": lambda h: 2.0**h,
    "pow-tensor-exponent": lambda h: (torch.sigmoid(h) + 0.5) ** h,
    # torch's export truncated where eager rounds down (negative quotients)
    "floor-divide": lambda h: h * ((h.detach() * 3) // 2),
    "right-shift": lambda h: h * ((h.detach() * 4).long() >> 1).float(),
    # torch's export cast float bounds to the integer tensor's type, where eager promotes the tensor
    "integer-clamp-float-bounds": lambda h: h * (h.detach() * 4).long().clamp(-1.5, 1.5),
    "integer-clamp-min": lambda h: h * torch.clamp_min((h.detach() * 4).long(), -0.5),
    "integer-clamp-max": lambda h: h * (h.detach() * 4).long().clamp(max=0.5),
    # ORT has no CumSum of bools (eager counts in int64): position ids from a mask fell back
    "bool-cumsum": lambda h: h * (h > 0).cumsum(-1),
    # ORT's CPU build has no bool EyeLike: a mask leaving out self-pairs fell back
    "bool-eye-mask": lambda h: h.masked_fill(torch.eye(h.shape[1], 8, dtype=torch.bool), 0.0),
}


@pytest.mark.parametrize("function", FUNCTIONS.values(), ids=FUNCTIONS.keys())
def test_function_trains_in_ort_like_eager(function: Callable[[torch.Tensor], torch.Tensor]) -> None:
    eager, ort = fit_both(lambda: Between(function), sequences, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def _ties(h: torch.Tensor, reduce: Callable[..., torch.Tensor]) -> torch.Tensor:
    """Every element tied with its detached copy: eager gives each half the gradient."""
    return reduce(torch.stack([h, h.detach()], -1), -1)


def _normalized(h: torch.Tensor) -> torch.Tensor:
    return (h - h.mean(-1, keepdim=True)) / (h.std(-1, keepdim=True) + 1e-6)


REDUCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "norm": lambda h: h / (1 + h.norm(dim=-1)).unsqueeze(-1),
    "norm-keepdim": lambda h: h / (1 + h.norm(dim=-1, keepdim=True)),
    "norm-full": lambda h: h / (1 + h.norm()),
    "norm-p1": lambda h: h / (1 + torch.norm(h, p=1, dim=(0, 1))),
    "norm-with-zeros": lambda h: h * F.relu(h - 1).norm(dim=-1, keepdim=True),
    "vector-norm-inf": lambda h: h / (1 + torch.linalg.vector_norm(h, float("inf"), dim=1, keepdim=True)),
    "vector-norm-fractional": lambda h: torch.linalg.vector_norm(h, 1.5, dim=-1, keepdim=True),
    "linalg-norm": lambda h: torch.linalg.norm(h, dim=-1, keepdim=True),
    "normalize": lambda h: F.normalize(h, dim=-1),
    "prod": lambda h: torch.prod(torch.sigmoid(h) + 0.5, dim=1, keepdim=True),
    "prod-with-zeros": lambda h: torch.prod(F.relu(h), -1, keepdim=True),
    "prod-full": lambda h: h * torch.prod(torch.sigmoid(h[0]) + 0.5),
    "amax": lambda h: h - h.amax(1, keepdim=True),
    "amax-ties": lambda h: _ties(h, torch.amax),
    "amin-ties": lambda h: _ties(h, torch.amin),
    "amin-full": lambda h: h - h.amin(),
    # the Annotated Transformer's LayerNorm over rows that are constant (std 0): ORT's gradient was NaN
    "std-of-constant-rows": lambda h: _normalized(h * (h[..., :1] > 0)),
    "std-biased": lambda h: h / (1 + h.std(1, unbiased=False, keepdim=True)),
    "std-correction": lambda h: h / (1 + torch.std(h, dim=(0, 2), correction=0)).unsqueeze(-1),
    "std-full": lambda h: h / (1 + h.std()),
}


@pytest.mark.parametrize("function", REDUCTIONS.values(), ids=REDUCTIONS.keys())
def test_reduction_trains_in_ort_like_eager(function: Callable[[torch.Tensor], torch.Tensor]) -> None:
    eager, ort = fit_both(lambda: Between(function), sequences, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class LearntBounds(Between):
    """PACT-style clipping with learnt bounds: ORT's ``Clip`` has no gradient for them (it fell back)."""

    def __init__(self) -> None:
        super().__init__(torch.nn.Identity())
        self.low = torch.nn.Parameter(torch.tensor(-0.3))
        self.high = torch.nn.Parameter(torch.full((8,), 0.3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inner(x)
        return self.head((h + h.clamp(min=self.low, max=self.high)).mean(1))


def test_clamp_with_learnt_bounds_trains_them_like_eager() -> None:
    eager, ort = fit_both(LearntBounds, sequences, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    assert float(ort.state["low"]) != -0.3 and not torch.equal(ort.state["high"], torch.full((8,), 0.3))


class ReducedThenUnsqueezed(Base):
    """A reduction's output given its dimension back, averaged over positions, scaled per class."""

    def __init__(self, reduce: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.reduce = reduce
        self.inner = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.linspace(-1, 1, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reduce(self.inner(x)).unsqueeze(-1).mean(1) * self.scale

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


RANK_REDUCING: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "amax": lambda h: h.amax(-1),
    "norm": lambda h: h.norm(dim=-1),
    "prod": lambda h: torch.prod(torch.sigmoid(h), -1),
    "logsumexp": lambda h: torch.logsumexp(h, -1),
    "nanmean": lambda h: h.nanmean(-1),
}


@pytest.mark.parametrize("reduce", RANK_REDUCING.values(), ids=RANK_REDUCING.keys())
def test_reduced_output_has_the_reduced_rank(reduce: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """ORT's shape inference gave these ATen nodes' outputs their input's rank, and the gradient graph
    of what followed reduced the wrong axes (it failed in the backward pass)."""
    eager, ort = fit_both(lambda: ReducedThenUnsqueezed(reduce), sequences, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
