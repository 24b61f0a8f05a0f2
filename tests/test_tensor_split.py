"""``tensor_split`` trains in ORT like eager (tensor_splits.py): torch exported it as an ONNX sequence,
which ORT does not differentiate. With another path from the same parameters to the loss (the residual
here) training was silently wrong; the first batch's sizes were kept too."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Between, sequence_batches
from torch.utils.data import DataLoader

from lightning_ort import ORTStrategy


def sequences() -> DataLoader:
    # batch sizes 4, 2, 3 (three parts of 2: one empty), lengths 6, 9, 1
    return sequence_batches([(4, 6), (2, 9), (3, 1), (4, 6)], 8)


def _weighted(parts: tuple[torch.Tensor, ...], dim: int) -> torch.Tensor:
    return torch.cat([part * (1 + 0.5 * index) for index, part in enumerate(parts)], dim)


SPLITS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "length-in-two": lambda h: _weighted(h.tensor_split(2, 1), 1),
    "batch-in-three": lambda h: _weighted(h.tensor_split(3), 0),
    "features-in-three": lambda h: _weighted(torch.tensor_split(h, 3, dim=-1), -1),
    "keywords": lambda h: _weighted(torch.tensor_split(h, sections=2, dim=1), 1),
    "at-indices": lambda h: _weighted(h.tensor_split([1, 3], dim=1), 1),
    "at-negative-indices": lambda h: _weighted(h.tensor_split((-2,), dim=-1), -1),
    "a-part-used-apart": lambda h: h * h.tensor_split(2, 1)[0].mean(1, keepdim=True),
}


@pytest.mark.parametrize("split", SPLITS.values(), ids=SPLITS.keys())
def test_tensor_split_trains_in_ort_like_eager(split: Callable[[torch.Tensor], torch.Tensor]) -> None:
    eager, ort = fit_both(lambda: Between(split), sequences, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_a_sequence_on_a_gradient_path_hands_the_module_to_pytorch() -> None:
    """A tensor of indices keeps torch's export, an ONNX sequence: ORT would leave its gradients out."""
    split = lambda h: _weighted(h.tensor_split(torch.tensor([2, 5]), dim=-1), -1)  # noqa: E731
    eager, ort = fit_both(lambda: Between(split), sequences, 4, strategy=ORTStrategy(fullgraph=True))
    (report,) = ort.reports
    assert "through an ONNX sequence" in str(report.fallback_reason)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
