"""``ORTStrategy(mode="auto")`` (the default): time ORT against PyTorch on each wrapped module, keep the faster.

ORT trains some models faster than eager PyTorch and some slower, and a user cannot tell in advance
which (``docs/performance.md``). In ``"auto"`` mode each wrapped module's first training calls run in
ORT (its export and first step), then one call in PyTorch (its own first-call costs), then ORT and
PyTorch take turns in the order ORT, PyTorch, PyTorch, ORT, ... (so that an optimizer step every second
call, with ``accumulate_grad_batches=2``, falls on both alike). Each call is timed from its start to the
start of the module's next training call, which covers its forward, backward, the optimizer step and
Lightning's loop, the same for both. After ``pairs`` calls of each the median periods decide, or earlier,
after ``EARLY`` calls of each, when every call of one path took less time than every call of the other:
the faster path runs the module for the rest of the run. ORT keeps it unless PyTorch measured more than
``1 / TIE`` times as fast (a difference within the measurement's noise is a tie, and the user asked for
ORT). A period that an inference call (validation) interrupts is not counted.

Both paths train the same parameters, buffers and optimizer, so the run is correct whichever ran a step:
BatchNorm statistics are updated in place by either, gradients accumulate in ``.grad`` as usual, and
PyTorch draws dropout masks from torch's generator as in eager. Choosing PyTorch exports nothing and
drops the module's ORT graphs (their memory) once no backward of theirs is pending.

A run too short for the measurement (fewer expected training calls than it takes: a smoke test,
``fast_dev_run``) trains in ORT throughout: there is nothing to measure, and such a run is how a user checks
that ORT takes the model. ORT's first call (the export) is not counted against ORT at the choice: by then
it is spent whichever path runs the rest.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from typing import Literal

from lightning.pytorch.utilities.rank_zero import rank_zero_info

log = logging.getLogger(__name__)

Mode = Literal["ort", "auto"]
MODES = ("ort", "auto")
ORT = "ort"
PYTORCH = "pytorch"
Path = Literal["ort", "pytorch"]

MEASURING = "timed against ORT (mode='auto')"


def chose_pytorch(speedup: float) -> str:
    """The reason the report gives for calls in PyTorch after ``mode="auto"`` chose it."""
    return f"mode='auto' measured PyTorch faster (ORT at {speedup:.2f}x its speed)"


def clock() -> float:
    """The time source of the measurement, in seconds (tests replace it to inject step times)."""
    return time.perf_counter()


TIE = 0.98  # ORT's measured speed relative to PyTorch's at or above which ORT keeps the module
EARLY = 4  # timed calls of each path after which a clear difference (no overlap) decides


class SpeedChoice:
    """Which path each training call of one wrapped module takes, and the measured choice.

    Args:
        name: the module's name in the reports.
        expected_calls: the number of training calls the run is expected to make (``None``: unknown or
            unbounded), asked once at the first call.
        warmup: ORT calls before the measurement (the first one exports the model).
        pairs: timed calls of each path; their medians decide.
        clock: the time source, in seconds (by default this module's :func:`clock`).
    """

    def __init__(
        self,
        name: str,
        expected_calls: Callable[[], int | None],
        warmup: int = 2,
        pairs: int = 8,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.name = name
        self.chosen: Path | None = None
        self.speedup: float | None = None  # PyTorch's median call period over ORT's (ORT's speed, higher is faster)
        self._expected_calls = expected_calls
        self._warmup = warmup
        self._pairs = pairs
        self._clock = clock
        self._schedule: list[Path] = [ORT] * warmup + [PYTORCH] + _alternating(pairs)
        self._calls = 0
        self._last: tuple[Path, float] | None = None  # the previous training call's path and start
        self._times: dict[Path, list[float]] = {ORT: [], PYTORCH: []}

    def pytorch_reason(self, training_call: bool) -> str | None:
        """Why this call runs in PyTorch, or ``None`` if it runs in ORT. ``training_call``: a call in training
        mode with gradients on (timed); any other call interrupts the period being timed."""
        if self.chosen == PYTORCH:
            assert self.speedup is not None
            return chose_pytorch(self.speedup)
        if self.chosen == ORT:
            return None
        if not training_call:
            self._last = None
            return None
        now = (self._clock or clock)()  # the module's clock looked up now, so that tests can replace it
        if self._calls == 0 and self._too_short():
            self.chosen = ORT
            log.info("lightning_ort: %s: the run is too short to time ORT against PyTorch; ORT runs it", self.name)
            return None
        if self._last is not None:
            path, start = self._last
            if self._calls > self._warmup + 1:
                self._times[path].append(now - start)
        if self._separated():
            return self._decide()
        if self._calls >= len(self._schedule):
            if min(len(times) for times in self._times.values()) * 2 >= self._pairs:
                return self._decide()
            self._schedule += _alternating(self._pairs)  # inference calls interrupted too many periods
        path = self._schedule[self._calls]
        self._calls += 1
        self._last = (path, now)
        return MEASURING if path == PYTORCH else None

    def _too_short(self) -> bool:
        expected = self._expected_calls()
        return expected is not None and expected <= len(self._schedule)

    def _separated(self) -> bool:
        """Whether ``EARLY`` or more timed calls of each path show a clear difference: every call of one path
        took less time than every call of the other (with equal speeds, 4 calls each fall so by chance 3% of
        the time, and then either choice is as good)."""
        ort, pytorch = self._times[ORT], self._times[PYTORCH]
        if min(len(ort), len(pytorch)) < EARLY:
            return False
        return max(ort) < min(pytorch) or max(pytorch) < min(ort)

    def _decide(self) -> str | None:
        ort, pytorch = statistics.median(self._times[ORT]), statistics.median(self._times[PYTORCH])
        self.speedup = pytorch / ort if ort > 0 else math.inf
        self.chosen = ORT if self.speedup >= TIE else PYTORCH
        steps = min(len(times) for times in self._times.values())
        rank_zero_info(
            f"lightning_ort: mode='auto' chose {'ORT' if self.chosen == ORT else 'PyTorch'} for {self.name}: ORT ran "
            f"at {self.speedup:.2f}x PyTorch's speed (median of {steps} steps each, {ort * 1000:.1f} against "
            f"{pytorch * 1000:.1f} ms)"
        )
        return None if self.chosen == ORT else chose_pytorch(self.speedup)


def _alternating(pairs: int) -> list[Path]:
    """ORT, PyTorch, PyTorch, ORT, ... : ``pairs`` calls of each, in pairs whose order alternates."""
    order: list[Path] = []
    for pair in range(pairs):
        order += [ORT, PYTORCH] if pair % 2 == 0 else [PYTORCH, ORT]
    return order
