"""``F.l1_loss``, ``F.smooth_l1_loss`` and ``F.huber_loss`` inside a forward train in ORT like eager
(regression_losses.py); torch could not export them and the module fell back to PyTorch."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Between, sequence_batches
from torch.utils.data import DataLoader


def sequences() -> DataLoader:
    return sequence_batches([(4, 6), (2, 9), (3, 1), (4, 6)], 8)


def _target(h: torch.Tensor) -> torch.Tensor:
    return torch.tanh(h.flip(-1))


LOSSES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "l1": lambda h: F.l1_loss(h, _target(h), reduction="none"),
    "l1-mean": lambda h: h * F.l1_loss(h, _target(h)),
    "l1-to-a-constant": lambda h: h * F.l1_loss(h, torch.zeros_like(h), reduction="sum"),
    "smooth-l1": lambda h: F.smooth_l1_loss(h, _target(h), reduction="none", beta=0.5),
    "smooth-l1-mean": lambda h: h * F.smooth_l1_loss(h, _target(h)),
    "smooth-l1-beta-0": lambda h: F.smooth_l1_loss(h, _target(h), reduction="none", beta=0.0),
    "smooth-l1-broadcast-target": lambda h: F.smooth_l1_loss(h, h[:, :1].expand_as(h), reduction="none"),
    "huber": lambda h: F.huber_loss(h, _target(h), reduction="none", delta=0.5),
    "huber-sum": lambda h: h * F.huber_loss(h, _target(h).detach(), reduction="sum", delta=2.0),
}


@pytest.mark.parametrize("loss", LOSSES.values(), ids=LOSSES.keys())
def test_regression_loss_in_forward_trains_in_ort_like_eager(loss: Callable[[torch.Tensor], torch.Tensor]) -> None:
    eager, ort = fit_both(lambda: Between(loss), sequences, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
