"""nn.RMSNorm, cumsum and torch.where with broadcast operands train in ORT like eager (onnx_gradients.py), as
do norms without weights over sizes read from the input (``F.rms_norm(x, x.shape[-1:])``), which fell back."""

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


class LlamaBlock(Base):
    """RMSNorm, a SwiGLU feed-forward and a residual, then a head over a cumulative sum of positions."""

    lr = 0.01

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.gate, self.up, self.down = nn.Linear(8, 16), nn.Linear(8, 16), nn.Linear(16, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return self.head(x.cumsum(1)[:, -1] / x.shape[1])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


def sequences() -> DataLoader:
    return sequence_batches([(4, 6), (2, 9), (3, 1), (4, 6)], 8)


class NormOverReadSizes(nn.Module):
    """A norm without weights whose ``normalized_shape`` is read from the input (modded-nanoGPT's
    ``F.rms_norm(x, (x.size(-1),))``, QK-norm, ``F.layer_norm(x, x.shape[-1:])``)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "rms":
            return F.rms_norm(x, (x.size(-1),))
        if self.kind == "rms-of-float":  # ORT's graph build failed on the cast before the norm
            return F.rms_norm(x.float(), (x.size(-1),)).type_as(x)
        return F.layer_norm(x, x.shape[-2:] if self.kind == "layer-last-two" else x.shape[-1:])


@pytest.mark.parametrize(
    "make_norm",
    [
        lambda: nn.RMSNorm(8),
        lambda: nn.RMSNorm(8, eps=1e-3, elementwise_affine=False),
        lambda: NormOverReadSizes("rms"),
        lambda: NormOverReadSizes("rms-of-float"),
        lambda: NormOverReadSizes("layer"),
        lambda: NormOverReadSizes("layer-last-two"),
    ],
    ids=[
        "rms-norm",
        "rms-norm-eps-no-weight",
        "rms-norm-read-size",
        "rms-norm-of-float",
        "layer-norm-read-size",
        "layer-norm-read-sizes",
    ],
)
def test_rms_norm_and_cumsum_train_in_ort_like_eager(make_norm: Any) -> None:
    eager, ort = fit_both(lambda: LlamaBlock(make_norm()), sequences, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


WHERE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    # ORT's gradient of Where did not sum a broadcast operand back: silently wrong
    "computed-row": lambda h: torch.where(h.detach() > 0, h, torch.tanh(h[0, 0])),
    "computed-row-first": lambda h: torch.where(h.detach() > 0, torch.tanh(h[:1, :1]), h),
    "mask-over-positions": lambda h: torch.where(h.detach().sum(-1, keepdim=True) > 0, h.mean(1, keepdim=True), h),
    "number": lambda h: torch.where(h.detach() > 0, h, 0.5),
}


@pytest.mark.parametrize("function", WHERE.values(), ids=WHERE.keys())
def test_where_with_broadcast_operands_trains_like_eager(function: Callable[[torch.Tensor], torch.Tensor]) -> None:
    eager, ort = fit_both(lambda: Between(function), lambda: sequence_batches([(4, 6), (2, 9), (3, 1)], 8), 3)
    assert_ort_ran(ort, 3)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
