"""Modules ORT would train wrongly or cannot export: PyTorch takes over with one warning, or the run stops."""

from __future__ import annotations

import warnings

import pytest
from helpers import assert_losses_match, assert_states_match, fit, fit_both
from models import BufferWriter, DataDependent, NoGradInForward, PythonCounter, STEModel, mlp_loader

from lightning_ort import ORTFallbackError, ORTStrategy

CASES = [
    (STEModel, "custom torch.autograd.Function(s) models.StraightThrough"),
    (DataDependent, "control flow or values that depend on tensor data"),
    (BufferWriter, "updates buffer(s) counter.calls in place"),
    (NoGradInForward, "its forward turns gradients off (torch.no_grad() or set_grad_enabled(False) at"),
    (PythonCounter, "its forward changes Python attribute(s) self.calls"),
]
IDS = ["autograd_function", "data_dependent", "buffer_write", "no_grad", "python_state"]


@pytest.mark.parametrize(("model_cls", "reason"), CASES, ids=IDS)
def test_warn_once_and_train_like_eager(model_cls: type, reason: str) -> None:
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        eager, ort = fit_both(model_cls, mlp_loader, 12, strategy=ORTStrategy(custom_autograd=False))
    ours = [str(r.message) for r in records if "lightning_ort: ORT cannot run" in str(r.message)]
    assert len(ours) == 1, ours
    assert "`forward`" in ours[0] and reason in ours[0]
    (report,) = ort.reports
    assert report.fallback_reason is not None and reason in report.fallback_reason
    assert report.ort_calls == 0 and report.torch_calls == 12
    # PyTorch trained it: exactly the eager result, custom backward and buffer updates included
    assert_losses_match(eager, ort, rtol=0)
    assert_states_match(eager, ort, atol=0, rtol=0)


@pytest.mark.parametrize(("model_cls", "reason"), CASES, ids=IDS)
def test_raise_stops_with_reason(model_cls: type, reason: str) -> None:
    with pytest.raises(ORTFallbackError, match="ORT cannot run `forward`") as info:
        fit(model_cls(), mlp_loader(), ORTStrategy(fallback="raise", custom_autograd=False), max_steps=2)
    assert reason in str(info.value)
    assert "fallback='warn'" in str(info.value)
