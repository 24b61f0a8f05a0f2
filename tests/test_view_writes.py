"""In-place changes of views in forward train like eager or fall back (view_writes.py): torch's ONNX export
dropped a change made through a view kept in a variable, or through a view other than indexing."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Between, sequence_batches
from torch.utils.data import DataLoader

from lightning_ort import ORTStrategy


def sequences() -> DataLoader:
    return sequence_batches([(4, 6), (2, 9), (3, 1), (1, 5)], 8)


def _scaled_in_a_variable(h: torch.Tensor) -> torch.Tensor:
    h = h * 1
    head = h[:, :, :4]
    head.mul_(2)
    return h


def _incremented(h: torch.Tensor) -> torch.Tensor:
    h = h * 1
    first = h[:, 0]
    first += 1
    return h


def _assigned_into_a_view(h: torch.Tensor) -> torch.Tensor:
    h = h * 1
    head = h[:, :, :4]
    head[:, 0] = 1.0
    return h


def _activated_in_place(h: torch.Tensor) -> torch.Tensor:
    h = h * 1
    head = h[:, :, :4]
    F.relu(head, inplace=True)
    return h


def _copied_then_read(h: torch.Tensor) -> torch.Tensor:
    h = h * 1
    head = h[:, :, :2]
    head.copy_(h[:, :, 2:4] * 3)
    return h + head.sum(-1, keepdim=True)


def _overlapping_views(h: torch.Tensor) -> torch.Tensor:
    h = h * 1
    left, middle = h[:, :, :4], h[:, :, 2:6]
    left.mul_(2)
    middle.add_(1)  # sees the doubled columns 2 and 3, as in eager
    return h + middle.sum(-1, keepdim=True)


def _view_of_a_view(h: torch.Tensor) -> torch.Tensor:
    h = h * 1
    head = h[:, :, :4]
    first = head[:, 0]
    first.mul_(3)
    return h + head.mean(-1, keepdim=True)


def _filled_buffer(h: torch.Tensor) -> torch.Tensor:
    mask = torch.zeros(h.shape[0], h.shape[1], 8)
    tail = mask[:, :, 2:]
    tail.fill_(1.0)
    return h * mask


# each was silently wrong: the graph left out the change (weights 0.03-0.23 off after five steps)
CHANGED: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "mul_-of-a-kept-view": _scaled_in_a_variable,
    "augmented-assignment": _incremented,
    "index-assignment-into-a-view": _assigned_into_a_view,
    "relu-inplace": _activated_in_place,
    "copy_-then-read": _copied_then_read,
    "overlapping-views": _overlapping_views,
    "view-of-a-view": _view_of_a_view,
    "fill_-of-a-constant": _filled_buffer,
}


@pytest.mark.parametrize("function", CHANGED.values(), ids=CHANGED.keys())
def test_changes_through_indexed_views_train_like_eager(function: Callable[[torch.Tensor], torch.Tensor]) -> None:
    eager, ort = fit_both(lambda: Between(function), sequences, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def _diagonal_shifted(h: torch.Tensor) -> torch.Tensor:
    gram = h.transpose(1, 2) @ h
    gram.diagonal(dim1=1, dim2=2).add_(1.0)
    return h @ gram


def _transposed_shifted(h: torch.Tensor) -> torch.Tensor:
    h = h * 1
    h.transpose(1, 2).add_(1.0)
    return h


def _flat_view_zeroed(h: torch.Tensor) -> torch.Tensor:
    h = h * 1
    h.view(-1)[:5].zero_()
    return h


REFUSED: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "diagonal": _diagonal_shifted,
    "transpose": _transposed_shifted,
    "view": _flat_view_zeroed,
}


@pytest.mark.parametrize("function", REFUSED.values(), ids=REFUSED.keys())
def test_changes_through_other_views_fall_back_with_the_fix(function: Callable[[torch.Tensor], torch.Tensor]) -> None:
    eager, ort = fit_both(
        lambda: Between(function), sequences, 4, strategy=ORTStrategy(fallback="warn", fullgraph=True)
    )
    (report,) = ort.reports
    reason = report.fallback_reason
    assert reason is not None and "changes a view in place at" in reason and "torch.diag_embed" in reason, reason
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def _linear_output_incremented(h: torch.Tensor) -> torch.Tensor:
    h += torch.linspace(-1, 1, 8)  # CaiT's x += pos_embedding
    return h


def _linear_output_scaled(h: torch.Tensor) -> torch.Tensor:
    return h.mul_(0.5)  # timm's LayerScale(inplace=True)


def _linear_output_activated(h: torch.Tensor) -> torch.Tensor:
    return F.relu(h, inplace=True)


# nn.Linear on a 3-D input returns a view of its own 2-D product, which nothing else holds: they fell back
LINEAR_OUTPUT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "augmented-assignment": _linear_output_incremented,
    "mul_": _linear_output_scaled,
    "relu-inplace": _linear_output_activated,
}


@pytest.mark.parametrize("function", LINEAR_OUTPUT.values(), ids=LINEAR_OUTPUT.keys())
def test_changes_of_a_linear_output_train_like_eager(function: Callable[[torch.Tensor], torch.Tensor]) -> None:
    eager, ort = fit_both(lambda: Between(function), sequences, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
