"""``lightning-ort``: a LightningCLI with ``lightning_ort`` imported, so ``strategy: ort`` works from any config.

The command takes Lightning's subcommands (``fit``, ``validate``, ``test``, ``predict``) with the model
and data given by ``class_path`` (in a ``--config`` file or as ``--model``/``--data``)::

    lightning-ort fit --config examples/cnn_digits/configs/ort.yaml
    lightning-ort fit --model my_project.Model --data my_project.Data --trainer.strategy=ort

and ``lightning-ort setup`` builds ORT's C++ extensions ahead of time (see ``lightning_ort.__main__``).
"""

from __future__ import annotations

import importlib
import os
import statistics
import sys
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.cli import ArgsType, LightningCLI
from lightning.pytorch.strategies import Strategy, StrategyRegistry
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from typing_extensions import override

import lightning_ort  # noqa: F401  (registers strategy="ort")
from lightning_ort.timing import StepTimer
from lightning_ort.wrapping import ORTStrategyMixin

__all__ = ["ORTLightningCLI", "RunSummary", "main"]

DESCRIPTION = """\
Train, validate, test or predict with a LightningModule and LightningDataModule named by class_path,
through ONNX Runtime with `--trainer.strategy=ort` (lightning_ort is imported, so the string works).
`lightning-ort setup [--verbose]` builds ORT's C++ extensions into the cache instead."""


class RunSummary(StepTimer):
    """At the end of ``fit``, ``validate`` or ``test``: print the final metrics, the training speed and
    what ORT ran; log ``steps_per_sec`` and ``first_step_sec`` to the Trainer's loggers.

    ``lightning-ort`` adds one to every Trainer (``ORTLightningCLI(summary=False)`` leaves it out).
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
        if isinstance(trainer.strategy, ORTStrategyMixin):
            lines += [f"  {line}" for line in _ort_lines(trainer.strategy)]
        print("\n".join(lines), flush=True)

    @property
    def _warmup_used(self) -> int:
        return self.warmup if self.step_times[self.warmup :] else 1


def _ort_lines(strategy: ORTStrategyMixin) -> list[str]:
    """One line per module ORT was asked to run: its calls, and why ORT gave up if it did."""
    reports = strategy.ort_reports
    if not reports:
        return ["ORT ran nothing (no module was selected)"]
    lines = []
    for report in reports:
        line = f"ORT ran `{report.name}`: {report.ort_calls} calls in ORT, {report.torch_calls} in PyTorch"
        for graph, reason in (("training", report.fallback_reason), ("inference", report.eval_fallback_reason)):
            if reason is not None:
                line += f"; gave up on its {graph} graph: {reason}"
        for reason, calls in report.torch_call_reasons.items():
            line += f"; {calls} in PyTorch because {reason}"
        if report.auto_choice is not None:
            speed = "" if report.measured_speedup is None else f" (ORT measured at {report.measured_speedup:.2f}x)"
            line += f"; mode='auto' chose {'ORT' if report.auto_choice == 'ort' else 'PyTorch'}{speed}"
        lines.append(line)
    return lines


def _strategy_from_class_path(value: str) -> str | Strategy:
    """``"pkg.module.SomeStrategy"`` (how LightningCLI parses ``--trainer.strategy=pkg.module.SomeStrategy``,
    Lightning issue 19682) as an instance with default arguments; any other string unchanged."""
    if value in StrategyRegistry or "." not in value:
        return value
    module_name, _, name = value.rpartition(".")
    try:
        candidate = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError):
        return value
    if isinstance(candidate, type) and issubclass(candidate, Strategy):
        return candidate()
    return value


class ORTLightningCLI(LightningCLI):
    """``LightningCLI`` for lightning_ort: ``strategy: ort`` is registered, a dotted strategy class given
    as a plain string is instantiated, and a :class:`RunSummary` is added to the Trainer.

    Takes LightningCLI's arguments. ``ORTStrategy``'s options are typed, so
    ``strategy: {class_path: lightning_ort.ORTStrategy, init_args: {...}}`` is validated and shown in
    full by ``--print_config``.

    Args:
        summary: add a :class:`RunSummary` callback to the Trainer.
    """

    def __init__(self, *args: Any, summary: bool = True, **kwargs: Any) -> None:
        self.summary = summary
        super().__init__(*args, **kwargs)

    @override
    def instantiate_trainer(self, **kwargs: Any) -> pl.Trainer:
        config = {**self._get(self.config_init, "trainer", default={})}
        strategy = config.get("strategy")
        if isinstance(strategy, str) and "strategy" not in kwargs:
            kwargs["strategy"] = _strategy_from_class_path(strategy)
        callbacks = config.get("callbacks") or []
        callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
        if self.summary and "callbacks" not in kwargs and not any(isinstance(c, RunSummary) for c in callbacks):
            kwargs["callbacks"] = [*callbacks, RunSummary()]
        return super().instantiate_trainer(**kwargs)


def main(args: ArgsType = None) -> ORTLightningCLI:
    """The ``lightning-ort`` command (without ``setup``): an :class:`ORTLightningCLI` over any
    LightningModule and LightningDataModule.

    Like ``python -m``, it puts the current directory first on ``sys.path``, so class paths can name
    modules of the project it is run from (``examples.gpt.model.GPT`` from the repository root).
    """
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    return ORTLightningCLI(
        model_class=None,
        datamodule_class=None,
        args=args,
        parser_kwargs={"prog": "lightning-ort", "description": DESCRIPTION},
    )
