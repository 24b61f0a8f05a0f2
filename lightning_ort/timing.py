"""``StepTimer``: a Lightning callback that times each training batch."""

from __future__ import annotations

import statistics
import time
from typing import Any

import lightning.pytorch as pl


class StepTimer(pl.Callback):
    """Records the wall time of every training batch (forward, backward and optimizer step).

    The first step includes one-off costs (for ORT: exporting the model and building its graphs),
    so the steady-state figures skip the first ``warmup`` steps.

    Args:
        warmup: steps left out of :attr:`median_step`.
    """

    def __init__(self, warmup: int = 5) -> None:
        super().__init__()
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"{type(self).__name__}(warmup={warmup!r}) must be an int >= 0.")
        self.warmup = warmup
        self.step_times: list[float] = []
        self._start: float | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.step_times = []

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._start is not None:
            self.step_times.append(time.perf_counter() - self._start)
            self._start = None

    @property
    def first_step(self) -> float | None:
        """Seconds of the first training step, or ``None`` before any step."""
        return self.step_times[0] if self.step_times else None

    @property
    def median_step(self) -> float | None:
        """Median seconds per step after the first ``warmup`` steps (all steps but the first if there are too few)."""
        steady = self.step_times[self.warmup :] or self.step_times[1:]
        return statistics.median(steady) if steady else None

    @property
    def steps_per_second(self) -> float | None:
        """``1 / median_step``."""
        median = self.median_step
        return 1.0 / median if median else None
