"""1-D and 3-D pooling behind convolutions trains in ORT like eager (pooling.py).

ORT's own gradient kernels for ONNX ``MaxPool``/``AveragePool`` crashed the process or failed on
these: the pooled tensors' sizes are only known at run time (a convolution over inputs whose every
dimension ORTModule exports as dynamic). The batches here change length from step to step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base, sequence_batches
from torch import nn
from torch.nn.functional import adaptive_avg_pool1d, avg_pool1d

import lightning_ort

Pool = Callable[[torch.Tensor], torch.Tensor]


class Sequences(Base):
    """A Conv1d over (batch, channels, length) sequences, ``pool``, and a head over the mean."""

    def __init__(self, pool: Pool) -> None:
        super().__init__()
        self.conv, self.pool, self.head = nn.Conv1d(4, 8, 3, padding=1), pool, nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(torch.relu(self.conv(x.transpose(1, 2)))).mean(2))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


class Volumes(Base):
    """A Conv3d over (batch, channels, length, length, length) volumes built from the sequences,
    ``pool``, and a head over the mean."""

    def __init__(self, pool: Pool) -> None:
        super().__init__()
        self.conv, self.pool, self.head = nn.Conv3d(4, 4, 3, padding=1), pool, nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = x.transpose(1, 2)
        volumes = v[:, :, :, None, None] * v[:, :, None, :, None] * v[:, :, None, None, :]
        return self.head(self.pool(self.conv(volumes)).flatten(2).mean(2))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


def _max_pool1d_values(h: torch.Tensor) -> torch.Tensor:
    output, indices = F.max_pool1d(h, 2, return_indices=True)
    return output


def _max_pool2d_values(h: torch.Tensor) -> torch.Tensor:
    output, indices = F.max_pool2d(h.unsqueeze(2), (1, 2), return_indices=True)
    return output.squeeze(2)


MODELS: dict[str, Callable[[], Base]] = {
    "max-pool-1d": lambda: Sequences(nn.MaxPool1d(2)),
    "max-pool-1d-strided-padded-dilated": lambda: Sequences(nn.MaxPool1d(3, stride=1, padding=1, dilation=2)),
    "max-pool-1d-ceil": lambda: Sequences(nn.MaxPool1d(2, ceil_mode=True)),
    "max-pool-1d-indices": lambda: Sequences(_max_pool1d_values),
    "max-pool-2d-indices": lambda: Sequences(_max_pool2d_values),
    "avg-pool-1d": lambda: Sequences(nn.AvgPool1d(2)),
    "avg-pool-1d-padded": lambda: Sequences(nn.AvgPool1d(3, stride=2, padding=1, count_include_pad=False)),
    "avg-pool-1d-ceil": lambda: Sequences(nn.AvgPool1d(2, ceil_mode=True)),
    "adaptive-avg-pool-1d": lambda: Sequences(nn.AdaptiveAvgPool1d(4)),
    "adaptive-avg-pool-1d-global": lambda: Sequences(nn.AdaptiveAvgPool1d(1)),
    "max-pool-3d": lambda: Volumes(nn.MaxPool3d(2)),
    "max-pool-3d-strided": lambda: Volumes(nn.MaxPool3d((2, 3, 2), stride=1, padding=1)),
    "avg-pool-3d": lambda: Volumes(nn.AvgPool3d(2)),
    "avg-pool-3d-divisor": lambda: Volumes(nn.AvgPool3d(2, ceil_mode=True, divisor_override=3)),
    "adaptive-avg-pool-3d": lambda: Volumes(nn.AdaptiveAvgPool3d((2, 3, 1))),
}


def _sequences() -> Any:
    return sequence_batches([(4, 6), (2, 9), (3, 5), (4, 7)], 4)


@pytest.mark.parametrize("make_model", MODELS.values(), ids=MODELS.keys())
def test_pooling_trains_in_ort_like_eager(make_model: Callable[[], Base]) -> None:
    eager, ort = fit_both(make_model, _sequences, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


@pytest.mark.parametrize("make_model", [MODELS["max-pool-1d"], MODELS["avg-pool-3d"]], ids=["max-1d", "avg-3d"])
def test_pooling_trains_without_op_rewrites(make_model: Callable[[], Base]) -> None:
    eager, ort = fit_both(make_model, _sequences, 4, strategy=lightning_ort.ORTStrategy(op_rewrites=False))
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


# A kernel or output size read from the input's length: torch's argument parser turns a tensor given
# alone for an int[1] into a number without a TracerWarning, so ORT's graph kept the first batch's
# length and pooled part of longer sequences (losses off by 3% from the third step, no warning).
SIZED_BY_LENGTH: dict[str, Pool] = {
    "max-pool-1d-over-length": lambda h: F.max_pool1d(h, h.shape[2]),
    "avg-pool-1d-over-length": lambda h: F.avg_pool1d(h, h.size(-1)),
    "adaptive-avg-pool-1d-half-length": lambda h: F.adaptive_avg_pool1d(h, h.shape[2] // 2),
}


class StoredPool(nn.Module):
    """Pools over the whole length with a pooling function it keeps as an attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.function = torch.max_pool1d

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.function(h, h.shape[2])


def _adaptive_avg_pool2d_over_half_length(h: torch.Tensor) -> torch.Tensor:
    return torch._C._nn.adaptive_avg_pool2d(h[:, :, None], h.shape[2] // 2).mean(2)


# The same, through a function bound before the export (imported by name, kept on a module, torch._C._nn):
# trained in ORT with losses off by up to 9% when only F's and torch's attributes were checked.
BOUND_BEFORE_EXPORT: dict[str, Pool] = {
    "avg-pool-1d-imported-by-name": lambda h: avg_pool1d(h, h.size(-1)),
    "adaptive-avg-pool-1d-imported-by-name": lambda h: adaptive_avg_pool1d(h, h.shape[2] // 2),
    "max-pool-1d-kept-on-a-module": StoredPool(),
    "adaptive-avg-pool-2d-torch-c-nn": _adaptive_avg_pool2d_over_half_length,
}


def _short_then_long() -> Any:
    return sequence_batches([(4, 5), (4, 10), (3, 11), (2, 5)], 4)


@pytest.mark.parametrize(
    "pool", [*SIZED_BY_LENGTH.values(), *BOUND_BEFORE_EXPORT.values()], ids=[*SIZED_BY_LENGTH, *BOUND_BEFORE_EXPORT]
)
def test_pooling_size_read_from_the_input_is_refused(pool: Pool) -> None:
    eager, ort = fit_both(
        lambda: Sequences(pool), _short_then_long, 4, strategy=lightning_ort.ORTStrategy(fullgraph=True)
    )
    (report,) = ort.reports
    assert report.fallback_reason is not None and "as a kernel or output size at" in report.fallback_reason
    assert report.ort_calls == 0
    assert_losses_match(eager, ort, rtol=0)
    assert_states_match(eager, ort, atol=0, rtol=0)


FIXED_BY_NAME: dict[str, Pool] = {
    "avg-pool-1d-imported-by-name": lambda h: avg_pool1d(h, kernel_size=2),
    "adaptive-avg-pool-1d-imported-by-name": lambda h: adaptive_avg_pool1d(h, output_size=3),
}


@pytest.mark.parametrize("pool", FIXED_BY_NAME.values(), ids=FIXED_BY_NAME.keys())
def test_fixed_pooling_size_through_a_bound_function_trains_in_ort(pool: Pool) -> None:
    eager, ort = fit_both(lambda: Sequences(pool), _short_then_long, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_pooling_over_length_as_a_reduction_trains_in_ort() -> None:
    """The fix the refusal suggests: a max over the length dimension."""
    eager, ort = fit_both(lambda: Sequences(lambda h: h.amax(2, keepdim=True)), _short_then_long, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
