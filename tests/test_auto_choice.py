"""``ORTStrategy(mode="auto")``: ORT and PyTorch take turns on each module, the faster path by the median keeps it.

The step times are injected (a virtual clock advanced per step by the path that ran it), so the choice is
deterministic; what is checked is the behaviour: the choice, the report, and that a run whose steps ran on
both paths trains exactly as far as eager PyTorch does.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from helpers import assert_losses_match, assert_states_match, fit, fit_both
from models import CNN, MLP, image_loader, mlp_loader

import lightning_ort
from lightning_ort import auto_choice
from lightning_ort.summary import ort_report_lines

# 2 ORT warm-up calls, 1 PyTorch warm-up call, 8 timed calls of each path; the choice is made at the next call
MEASURED_CALLS = 2 + 1 + 16


class VirtualTime(L.Callback):
    """Advances the measurement's clock after each training batch by the cost of the path that ran it."""

    def __init__(self, ort_seconds: float, pytorch_seconds: float) -> None:
        self.now = 0.0
        self.costs = {True: ort_seconds, False: pytorch_seconds}
        self.paths: list[str] = []
        self.ort_modules: list[int] = []  # how many modules held ORT graphs after each batch
        self._ort_calls = 0

    def clock(self) -> float:
        return self.now

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if not isinstance(trainer.strategy, lightning_ort.ORTStrategy):
            return
        calls = sum(report.ort_calls for report in trainer.strategy.ort_reports)
        ran_ort = calls > self._ort_calls
        self._ort_calls = calls
        self.paths.append("ort" if ran_ort else "pytorch")
        self.ort_modules.append(len(trainer.strategy.ort_modules))
        self.now += self.costs[ran_ort]


def _fit_auto(
    monkeypatch: pytest.MonkeyPatch, make_model: Any, make_loader: Any, ort_seconds: float, pytorch_seconds: float,
    steps: int, **overrides: Any,
) -> tuple[Any, Any, VirtualTime]:  # fmt: skip
    timer = VirtualTime(ort_seconds, pytorch_seconds)
    monkeypatch.setattr(auto_choice, "clock", timer.clock)
    eager, auto = fit_both(
        make_model, make_loader, steps, strategy=lightning_ort.ORTStrategy(mode="auto"), callbacks=[timer], **overrides
    )
    return eager, auto, timer


def test_auto_keeps_ort_where_it_is_faster_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    eager, auto, timer = _fit_auto(monkeypatch, MLP, mlp_loader, 1.0, 2.0, 30)
    (report,) = auto.reports
    assert report.auto_choice == "ort" and report.measured_speedup == pytest.approx(2.0)
    assert report.first_call_seconds == pytest.approx(1.0)
    assert report.fallback_reason is None and report.uses_ort
    # both paths ran while measuring, then ORT only
    assert timer.paths[:3] == ["ort", "ort", "pytorch"] and "pytorch" in timer.paths[3:MEASURED_CALLS]
    assert set(timer.paths[MEASURED_CALLS:]) == {"ort"}
    assert report.torch_call_reasons == {auto_choice.MEASURING: 9}
    assert report.ort_calls == 30 - 9
    assert set(timer.ort_modules) == {1}  # the graphs stay
    assert auto.trainer.strategy.ort_parameter_share == 1
    assert_losses_match(eager, auto)
    assert_states_match(eager, auto)
    lines = ort_report_lines(auto.trainer.strategy.ort_reports)
    assert any("mode='auto' chose ORT (ORT measured at 2.00x)" in line for line in lines)


def test_auto_chooses_pytorch_where_it_is_faster_and_drops_the_ort_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    eager, auto, timer = _fit_auto(monkeypatch, MLP, mlp_loader, 2.0, 1.0, 30)
    (report,) = auto.reports
    assert report.auto_choice == "pytorch" and report.measured_speedup == pytest.approx(0.5)
    assert not report.uses_ort and report.fallback_reason is None
    assert set(timer.paths[MEASURED_CALLS:]) == {"pytorch"}
    assert report.torch_call_reasons[auto_choice.chose_pytorch(0.5)] == 30 - MEASURED_CALLS
    assert report.ort_calls == 10
    # ORT's graphs are dropped at the first call after the choice
    assert set(timer.ort_modules[:MEASURED_CALLS]) == {1} and set(timer.ort_modules[MEASURED_CALLS:]) == {0}
    assert auto.trainer.strategy.ort_parameter_share == 0
    assert_losses_match(eager, auto)
    assert_states_match(eager, auto)


def test_both_paths_keep_batch_norm_statistics_and_accumulated_gradients_as_eager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Steps alternate between ORT and PyTorch within accumulated optimizer steps; BatchNorm's running
    statistics and counters, the momentum buffers and the weights end as eager's."""
    eager, auto, timer = _fit_auto(
        monkeypatch, lambda: CNN(), image_loader, 1.0, 1.5, 24, accumulate_grad_batches=2, max_epochs=10
    )
    (report,) = auto.reports
    assert report.auto_choice == "ort" and report.fallback_reason is None
    assert timer.paths[:MEASURED_CALLS].count("pytorch") == 9
    assert_losses_match(eager, auto, rtol=1e-5)
    assert_states_match(eager, auto)
    assert torch.equal(auto.state["features.1.num_batches_tracked"], eager.state["features.1.num_batches_tracked"])


def test_a_run_shorter_than_the_measurement_trains_in_pytorch_without_exporting() -> None:
    torch.manual_seed(0)
    run = fit(MLP(), mlp_loader(), lightning_ort.ORTStrategy(mode="auto"), max_steps=10)
    (report,) = run.reports
    assert report.auto_choice == "pytorch" and report.measured_speedup is None
    assert report.ort_calls == 0 and report.torch_calls == 10
    assert report.torch_call_reasons == {auto_choice.SHORT_RUN: 10}


def test_mode_ort_measures_nothing() -> None:
    torch.manual_seed(0)
    run = fit(MLP(), mlp_loader(), lightning_ort.ORTStrategy(mode="ort"), max_steps=3)
    (report,) = run.reports
    assert report.auto_choice is None and report.measured_speedup is None and report.torch_calls == 0


def test_mode_must_be_ort_or_auto() -> None:
    with pytest.raises(ValueError, match=r"ORTStrategy\(mode='fast'\) must be 'ort' .* or 'auto'"):
        lightning_ort.ORTStrategy(mode="fast")  # type: ignore[arg-type]
