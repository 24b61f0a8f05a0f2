"""``ORTLogVerbosity``: how much ORT logs, routed into Python ``logging``."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_ort import engine
from lightning_ort.callbacks._ort import ORTRunStrategy, ort_strategy, reports_by_name
from lightning_ort.engine import LOG_LEVELS, NATIVE_LOGGER, PYTHON_LOGGER, LogLevelName


class ORTLogVerbosity(Callback):
    """Set ORT's verbosity and send its messages to Python ``logging``.

    ORTModule's Python-side messages are logged under ``lightning_ort.ort`` and the native
    runtime's (graph optimizers, sessions, kernels), which ORT writes to stderr, under
    ``lightning_ort.ort.native``, at the matching Python level (``VERBOSE`` is ``DEBUG``,
    ``FATAL`` is ``CRITICAL``). Both loggers propagate to ``lightning_ort`` and the root logger,
    so handlers, levels and filters of the user's logging configuration apply. Overrides the
    strategy's own ``log_level``.

    Args:
        level: ORT's verbosity: ``"VERBOSE"``, ``"INFO"``, ``"WARNING"``, ``"ERROR"`` or ``"FATAL"``.
            Native messages follow ORT's own mapping, in which ``"INFO"`` keeps native warnings
            only (ORT's native INFO is very chatty); ``"VERBOSE"`` shows everything.
        setup_level: a different verbosity for the batches in which ORT exports and builds a graph
            (the first training step, the first batch of validation, test or predict), e.g.
            ``"VERBOSE"`` to see what the export does without flooding every later step.
    """

    def __init__(self, level: LogLevelName = "WARNING", setup_level: LogLevelName | None = None) -> None:
        if level not in LOG_LEVELS:
            raise ValueError(f"ORTLogVerbosity(level={level!r}) is not one of {', '.join(LOG_LEVELS)}.")
        if setup_level is not None and setup_level not in LOG_LEVELS:
            raise ValueError(
                f"ORTLogVerbosity(setup_level={setup_level!r}) is not one of {', '.join(LOG_LEVELS)}, "
                "or None to keep `level` during the export step too."
            )
        self.level: LogLevelName = level
        self.setup_level: LogLevelName = setup_level or level
        self._strategy: ORTRunStrategy | None = None
        self._saved_options: engine.ORTRuntimeOptions | None = None
        self._route: engine.PythonLogRoute | None = None
        self._native = engine.NativeLogCapture(logging.getLogger(NATIVE_LOGGER))
        self._current: LogLevelName | None = None
        self._configured: dict[str, torch.nn.Module] = {}

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._strategy = ort_strategy(trainer, "ORTLogVerbosity")
        if self._strategy is None:
            return
        # ORTStrategy creates its ORTModules after the callbacks' setup, with these options.
        self._saved_options = self._strategy.runtime_options
        self._strategy.runtime_options = dataclasses.replace(self._saved_options, log_level=self.setup_level)
        self._route = engine.PythonLogRoute(logging.getLogger(PYTHON_LOGGER), self._native.stderr_elsewhere)
        engine.set_python_log_level(self.setup_level)
        self._current = None
        self._configured = {}

    def _builds_graph(self, training: bool) -> bool:
        assert self._strategy is not None
        reports = reports_by_name(self._strategy)
        for name, ort_module in self._strategy.ort_modules.items():
            report = reports[name]
            gave_up = report.fallback_reason if training else report.eval_fallback_reason
            if gave_up is None and engine.exported_model(ort_module, training) is None:
                return True
        return False

    def _begin_batch(self, training: bool) -> None:
        if self._strategy is None:
            return
        level = self.setup_level if self._builds_graph(training) else self.level
        changed = level != self._current
        for name, ort_module in self._strategy.ort_modules.items():
            # ORTStrategy may wrap new modules mid-run (children instead of `forward` after the first step).
            if changed or self._configured.get(name) is not ort_module:
                engine.set_log_level(ort_module, level)
                self._configured[name] = ort_module
        if changed:
            engine.set_python_log_level(level)
            if self._route is not None:
                # Below WARNING, torch's export prints the whole graph, which ORT replays as a WARNING.
                below_warning = engine.python_level(level) < logging.WARNING
                self._route.replay_level = engine.python_level(level) if below_warning else None
            self._current = level
        self._native.start(engine.python_level(level))

    def _end_batch(self) -> None:
        if self._route is not None:
            self._route.hand_on_held()
        self._native.stop()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._begin_batch(training=True)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._end_batch()

    @override
    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._begin_batch(training=False)

    @override
    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._end_batch()

    @override
    def on_test_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._begin_batch(training=False)

    @override
    def on_test_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._end_batch()

    @override
    def on_predict_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._begin_batch(training=False)

    @override
    def on_predict_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._end_batch()

    def _restore(self) -> None:
        self._native.close()
        if self._route is not None:
            self._route.close()
            self._route = None
        if self._strategy is not None and self._saved_options is not None:
            self._strategy.runtime_options = self._saved_options
            self._saved_options = None

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._restore()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore()
