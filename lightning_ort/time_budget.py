"""A time budget for the ORT calls that export and build a graph, so that no model can hang a run."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from lightning_ort.errors import ORTExportTimeoutError


@contextlib.contextmanager
def time_budget(seconds: float | None, what: str) -> Iterator[None]:
    """Raise :class:`ORTExportTimeoutError` in the block once it has run for ``seconds``.

    A timer signal interrupts Python code (the export's tracing); a graph build in ORT's C++ code is
    interrupted when it returns to Python. Only the main thread receives signals, and a timer someone else
    set (pytest-timeout, the user's own) is left alone: the block then runs without a budget.
    """
    if (
        seconds is None
        or threading.current_thread() is not threading.main_thread()
        or signal.getitimer(signal.ITIMER_REAL)[0] > 0
    ):
        yield
        return

    def expired(signum: int, frame: FrameType | None) -> None:
        raise ORTExportTimeoutError(
            f"exporting and building ORT's graph of {what} took longer than export_timeout={seconds:g} s. "
            "Fix: ORTStrategy(export_timeout=...) with more seconds, or None for no limit"
        )

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
