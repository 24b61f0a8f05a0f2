"""A time budget for exports: a module whose export and graph build take too long falls back, never hangs."""

from __future__ import annotations

import time

import pytest
import torch
from helpers import assert_losses_match, fit, fit_both
from models import MLP, mlp_loader

from lightning_ort import ORTStrategy


class SlowExport(MLP):
    """Its forward takes 10 minutes while ORT exports it (a stand-in for an export that never ends)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.onnx.is_in_onnx_export():
            time.sleep(600)
        return super().forward(x)


def test_an_export_past_its_budget_falls_back_and_its_submodules_run_in_ort() -> None:
    started = time.monotonic()
    eager, ort = fit_both(SlowExport, mlp_loader, 4, strategy=ORTStrategy(export_timeout=20))
    assert time.monotonic() - started < 600, "the export ran to its end"
    forward, body, head = ort.reports
    assert forward.fallback_reason is not None and "took longer than export_timeout=20 s" in forward.fallback_reason
    assert "ORTStrategy(export_timeout=...)" in forward.fallback_reason
    assert forward.submodules == ["body", "head"]
    assert body.fallback_reason is None and body.ort_calls == 4 and head.ort_calls == 4
    assert_losses_match(eager, ort)


@pytest.mark.parametrize("value", [0, -1.0, True, "60"])
def test_a_bad_budget_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match=r"export_timeout=.* must be a positive number of seconds or None"):
        ORTStrategy(export_timeout=value)  # type: ignore[arg-type]


def test_no_budget_runs_the_export_to_its_end() -> None:
    run = fit(MLP(), mlp_loader(), ORTStrategy(export_timeout=None), max_steps=2)
    assert run.reports[0].fallback_reason is None and run.reports[0].ort_calls == 2
