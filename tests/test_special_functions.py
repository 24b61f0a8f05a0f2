"""Functions torch cannot export or ORT cannot differentiate train in ORT like eager
(special_functions.py; nansum / nanmean / count_nonzero in reductions.py, diff / take_along_dim in
indexing.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Between, sequence_batches
from torch.distributions import Beta, Dirichlet, Gamma, Poisson, StudentT
from torch.utils.data import DataLoader


def sequences() -> DataLoader:
    return sequence_batches([(4, 6), (2, 9), (3, 1), (4, 6)], 8)


def _positive(h: torch.Tensor) -> torch.Tensor:
    return F.softplus(h) + 0.5


FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "lgamma": lambda h: torch.lgamma(_positive(h)),
    "digamma": lambda h: torch.digamma(_positive(h)),
    "polygamma": lambda h: torch.polygamma(1, _positive(h)),
    "mvlgamma": lambda h: torch.mvlgamma(_positive(h) + 1, p=2),
    "erfinv": lambda h: torch.erfinv(0.9 * torch.tanh(h)),
    "erfc": torch.erfc,
    "exp2": lambda h: torch.exp2(h.clamp(max=3)),
    "sinc": torch.sinc,
    "frac": lambda h: torch.frac(3 * h),
    "deg2rad": torch.deg2rad,
    "i0": torch.i0,
    "asinh": torch.asinh,
    "acosh": lambda h: torch.acosh(_positive(h) + 1),
    "atanh": lambda h: torch.atanh(0.9 * torch.tanh(h)),
    # computed in float64, as eager does
    "float-power": lambda h: torch.float_power(_positive(h), 1.5).float(),
    "float-power-tensor-exponent": lambda h: torch.float_power(_positive(h), torch.sigmoid(h.flip(-1))).float(),
    "ndtr": torch.special.ndtr,
    "log-ndtr": torch.special.log_ndtr,
    "entr": lambda h: torch.special.entr(torch.sigmoid(h)),
    # torch returns sgn's gradient as a ZeroTensor, which owns no memory (ORT crashed on it)
    "sgn": lambda h: h * torch.sgn(h),
    # ORT has no gradient for these ONNX ops; eager's is zero
    "round": lambda h: h * torch.round(3 * h),
    "round-decimals": lambda h: h * torch.round(h, decimals=1),
    "floor-ceil": lambda h: h * (torch.floor(3 * h) + torch.ceil(2 * h)),
    "atan2": lambda h: torch.atan2(h, h.flip(-1) + 0.5),
    "atan2-constant-side": lambda h: torch.atan2(h, torch.linspace(-1, 1, 8)),
    "hypot": lambda h: torch.hypot(h, h.roll(1, -1)),
    "copysign": lambda h: torch.copysign(h, h.flip(-1)),
    "copysign-number": lambda h: torch.copysign(h, -1.0),
    "xlogy": lambda h: torch.xlogy(F.relu(h), torch.sigmoid(h.flip(-1))),
    "xlogy-number-self": lambda h: torch.xlogy(2.0, torch.sigmoid(h)),
    "xlog1py": lambda h: torch.special.xlog1py(h, torch.sigmoid(h)),
    "logaddexp": lambda h: torch.logaddexp(h, h.flip(-1)),
    "logaddexp2": lambda h: torch.logaddexp2(h, 0.5 * h),
    "fmod-number": lambda h: torch.fmod(h, 0.7),
    "remainder": lambda h: h % (torch.sigmoid(h.flip(-1)) + 0.5),
    "nansum": lambda h: h.masked_fill(h > 0.5, float("nan")).nansum(-1, keepdim=True),
    "nanmean": lambda h: h.masked_fill(h > 0.5, float("nan")).nanmean(-1, keepdim=True),
    "nanmean-full": lambda h: h * h.masked_fill(h > 0.5, float("nan")).nanmean(),
    "diff": lambda h: F.pad(torch.diff(h, dim=-1), (1, 0)),
    "diff-twice-over-length": lambda h: F.pad(torch.diff(h, n=2, dim=1), (0, 0, 2, 0)),
    "diff-prepend": lambda h: torch.diff(h, dim=-1, prepend=h[..., :1] * 0.5),
    "count-nonzero": lambda h: h * torch.count_nonzero(h > 0, -1).unsqueeze(-1),
    "count-nonzero-all": lambda h: h * torch.count_nonzero(F.relu(h)),
    "take-along-dim": lambda h: torch.take_along_dim(h, h.detach().argsort(-1), dim=-1),
    "beta-log-prob": lambda h: Beta(_positive(h), _positive(h.flip(-1))).log_prob(torch.full_like(h, 0.3)),
    "gamma-log-prob": lambda h: Gamma(_positive(h), _positive(h.flip(-1))).log_prob(torch.full_like(h, 0.7)),
    "poisson-log-prob": lambda h: Poisson(_positive(h)).log_prob(torch.full_like(h, 2.0)),
    "student-t-log-prob": lambda h: StudentT(3.0, h, _positive(h.flip(-1))).log_prob(torch.full_like(h, 0.3)),
    "dirichlet-log-prob": lambda h: (
        h * Dirichlet(_positive(h)).log_prob(torch.softmax(h.detach().flip(-1), -1)).unsqueeze(-1)
    ),
}


@pytest.mark.parametrize("function", FUNCTIONS.values(), ids=FUNCTIONS.keys())
def test_function_trains_in_ort_like_eager(function: Callable[[torch.Tensor], torch.Tensor]) -> None:
    eager, ort = fit_both(lambda: Between(function), sequences, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
