"""The run summary: what ran in ORT, the first training step's cost and the training speed, in a few lines.

Every fit with an ORT strategy ends with one, logged by the strategy (:func:`fit_summary`); the
``lightning-ort`` command prints a longer one with the final metrics (:class:`RunSummary`) instead.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from typing_extensions import override

from lightning_ort.report import ORTModuleReport
from lightning_ort.timing import StepTimer

__all__ = ["RunSummary", "fit_summary", "ort_report_lines"]


def ort_report_lines(reports: Sequence[ORTModuleReport], share: float | None = None) -> list[str]:
    """What ORT ran: the share of trainable parameters it trains (when several modules were wrapped), then one
    line per module with its calls in ORT and in PyTorch and why ORT gave up if it did; more than six modules
    that ran only in ORT share one line."""
    if not reports:
        return ["ORT ran nothing (no module was selected)"]
    lines = []
    clean = [r for r in reports if r.uses_ort and not r.torch_calls and not r.submodules and r.ort_calls]
    if share is not None and len(reports) > 1:
        lines.append(f"ORT trains {share:.0%} of the trainable parameters, in {len(clean)} module graph(s)")
    if len(clean) > 6:
        names = ", ".join(f"`{report.name}`" for report in clean[:6])
        calls = sum(report.ort_calls for report in clean)
        first = sum(report.first_call_seconds or 0.0 for report in clean)
        lines.append(
            f"ORT ran {names} and {len(clean) - 6} more: {calls} calls in ORT, 0 in PyTorch; "
            f"their first ORT calls {first:.2f} s together"
        )
        reports = [report for report in reports if report not in clean]
    for report in reports:
        line = f"ORT ran `{report.name}`: {report.ort_calls} calls in ORT, {report.torch_calls} in PyTorch"
        if report.first_call_seconds is not None:
            line += f" (first ORT call {report.first_call_seconds:.2f} s, export included)"
        for graph, reason in (("training", report.fallback_reason), ("inference", report.eval_fallback_reason)):
            if reason is not None:
                line += f"; gave up on its {graph} graph: {reason}"
        if report.submodules:
            line += f"; ORT runs its {len(report.submodules)} submodule(s) instead"
        for reason, calls in report.torch_call_reasons.items():
            line += f"; {calls} in PyTorch because {reason}"
        if report.auto_choice is not None and report.measured_speedup is None:
            line += "; mode='auto': too short a run to time ORT against PyTorch"
        elif report.auto_choice is not None:
            chosen = "ORT" if report.auto_choice == "ort" else "PyTorch"
            line += f"; mode='auto' chose {chosen} (ORT measured at {report.measured_speedup:.2f}x)"
        lines.append(line)
    return lines


def fit_summary(
    strategy_name: str,
    reports: Sequence[ORTModuleReport],
    batch_starts: Sequence[float],
    end: float,
    warmup: int = 5,
    share: float | None = None,
) -> str:
    """The summary a fit with an ORT strategy ends with.

    Args:
        strategy_name: the strategy's class name.
        reports: the strategy's ``ort_reports``.
        batch_starts: ``time.perf_counter()`` at the start of each training batch.
        end: ``time.perf_counter()`` at the end of training.
        warmup: steps left out of the steady speed (the first ones include ORT's export and graph builds).
        share: the strategy's ``ort_parameter_share``.

    A step's time runs from its start to the next step's start (data loading and any validation in
    between included); the last step's, to the end of training. The speed is the median of the steps
    after ``warmup`` without the last (the end-of-fit validation would count in it).
    """
    lines = [f"lightning_ort: fit summary ({strategy_name})"]
    if batch_starts:
        times = [later - earlier for earlier, later in zip(batch_starts, [*batch_starts[1:], end], strict=True)]
        detail = f"{len(times)} training steps in {end - batch_starts[0]:.1f} s, the first {times[0]:.3f} s"
        first, last = (warmup, len(times) - 1) if len(times) - 1 > warmup else (1, len(times) - 1)
        if last > first:
            median = statistics.median(times[first:last])
            steps = f"step {last}" if last == first + 1 else f"steps {first + 1}-{last}"
            detail += f", then {1 / median:.2f} steps/s (median of {steps})"
        lines.append(f"  {detail}")
    lines += [f"  {line}" for line in ort_report_lines(reports, share)]
    return "\n".join(lines)


class RunSummary(StepTimer):
    """At the end of ``fit``, ``validate`` or ``test``: print the final metrics, the training speed and
    what ORT ran; log ``steps_per_sec`` and ``first_step_sec`` to the Trainer's loggers.

    ``lightning-ort`` adds one to every Trainer (``ORTLightningCLI(summary=False)`` leaves it out); with
    one among a Trainer's callbacks, an ORT strategy leaves its own shorter summary out.
    The first training steps include one-off costs (for ORT: exporting the model and building its
    graphs), so the speed is the median step time after the first ``warmup`` steps.

    Args:
        warmup: steps left out of the median step time.
    """

    @override
    @rank_zero_only
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage not in ("fit", "validate", "test"):
            return
        stage = getattr(stage, "value", stage)
        lines = [f"lightning-ort {stage} summary (strategy: {type(trainer.strategy).__name__})"]
        if stage == "fit" and self.step_times:
            speed = self.steps_per_second
            detail = f"{len(self.step_times)} steps, first {self.step_times[0]:.3f} s"
            if speed is not None:
                steady = self.step_times[self._warmup_used :]
                detail += (
                    f", then {speed:.2f} steps/s (steps {self._warmup_used + 1}-{len(self.step_times)}: "
                    f"median {self.median_step:.4f} s, mean {statistics.fmean(steady):.4f} s)"
                )
                for logger in trainer.loggers:
                    logger.log_metrics(
                        {"steps_per_sec": speed, "first_step_sec": self.step_times[0]}, step=trainer.global_step
                    )
            lines.append(f"  training: {detail}")
        metrics = {name: value for name, value in sorted(trainer.callback_metrics.items()) if value.numel() == 1}
        if metrics:
            lines.append(
                "  final metrics: " + "  ".join(f"{name}={float(value):.4f}" for name, value in metrics.items())
            )
        reports = getattr(trainer.strategy, "ort_reports", None)  # an ORT strategy (wrapping.py imports this module)
        if reports is not None:
            share = getattr(trainer.strategy, "ort_parameter_share", None)
            lines += [f"  {line}" for line in ort_report_lines(reports, share)]
        print("\n".join(lines), flush=True)

    @property
    def _warmup_used(self) -> int:
        return self.warmup if self.step_times[self.warmup :] else 1
