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

# 2 ORT warm-up calls, 1 PyTorch warm-up call, then timed calls of each path: 4 when every call of one path is
# faster than every call of the other, else 8; the choice is made at the next call
EARLY_CALLS = 2 + 1 + 8
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
    assert report.first_call_seconds is not None and report.first_call_seconds > 0
    assert report.fallback_reason is None and report.uses_ort
    # both paths ran while measuring (4 timed calls each: every ORT call was faster), then ORT only
    assert timer.paths[:3] == ["ort", "ort", "pytorch"] and "pytorch" in timer.paths[3:EARLY_CALLS]
    assert set(timer.paths[EARLY_CALLS:]) == {"ort"}
    assert report.torch_call_reasons == {auto_choice.MEASURING: 5}
    assert report.ort_calls == 30 - 5
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
    assert set(timer.paths[EARLY_CALLS:]) == {"pytorch"}
    assert report.torch_call_reasons[auto_choice.chose_pytorch(0.5)] == 30 - EARLY_CALLS
    assert report.ort_calls == 6
    # ORT's graphs are dropped at the first call after the choice
    assert set(timer.ort_modules[:EARLY_CALLS]) == {1} and set(timer.ort_modules[EARLY_CALLS:]) == {0}
    assert auto.trainer.strategy.ort_parameter_share == 0
    assert_losses_match(eager, auto)
    assert_states_match(eager, auto)


@pytest.mark.parametrize(
    ("ort_seconds", "chosen", "ort_calls"),
    [
        (1.0, "ort", 30 - 9),  # equal medians: no early decision, 8 timed calls each, then ORT keeps the module
        (1.015, "ort", 30 - 5),  # PyTorch 1.5% faster, every call: decided early, and within 2%: a tie, ORT
        (1.05, "pytorch", 6),  # PyTorch 5% faster: PyTorch
    ],
)
def test_a_difference_within_two_percent_is_a_tie_that_ort_keeps(
    monkeypatch: pytest.MonkeyPatch, ort_seconds: float, chosen: str, ort_calls: int
) -> None:
    _, auto, timer = _fit_auto(monkeypatch, MLP, mlp_loader, ort_seconds, 1.0, 30)
    (report,) = auto.reports
    assert report.auto_choice == chosen
    assert report.measured_speedup == pytest.approx(1.0 / ort_seconds)
    assert report.ort_calls == ort_calls


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
    assert timer.paths[:EARLY_CALLS].count("pytorch") == 5
    assert_losses_match(eager, auto, rtol=1e-5)
    assert_states_match(eager, auto)
    assert torch.equal(auto.state["features.1.num_batches_tracked"], eager.state["features.1.num_batches_tracked"])


def test_a_run_shorter_than_the_measurement_trains_in_ort_throughout() -> None:
    torch.manual_seed(0)
    run = fit(MLP(), mlp_loader(), lightning_ort.ORTStrategy(mode="auto"), max_steps=10)
    (report,) = run.reports
    assert report.auto_choice == "ort" and report.measured_speedup is None
    assert report.ort_calls == 10 and report.torch_calls == 0
    assert report.first_call_seconds is not None and report.first_call_seconds > 0


def test_auto_is_the_default_mode() -> None:
    assert lightning_ort.ORTStrategy().mode == "auto"
    assert lightning_ort.ORTDDPStrategy().mode == "auto"


def test_mode_ort_measures_nothing() -> None:
    torch.manual_seed(0)
    run = fit(MLP(), mlp_loader(), lightning_ort.ORTStrategy(mode="ort"), max_steps=3)
    (report,) = run.reports
    assert report.auto_choice is None and report.measured_speedup is None and report.torch_calls == 0


def test_mode_must_be_ort_or_auto() -> None:
    with pytest.raises(ValueError, match=r"ORTStrategy\(mode='fast'\) must be 'ort' .* or 'auto'"):
        lightning_ort.ORTStrategy(mode="fast")  # type: ignore[arg-type]
