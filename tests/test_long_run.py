"""Long runs: memory stays flat over thousands of steps; repeated fits leak no files or threads."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import lightning as L
import pytest
import torch
from helpers import fit
from models import MLP, mlp_loader

from lightning_ort import ORTStrategy

STEPS = 2000
WARM_UP = 200


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """One torch thread: on a machine shared with other work, OpenMP threads waiting on each other
    can make tiny steps 10x slower (docs/faq.md); the figures measured here do not depend on it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def native_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def native_thread_names() -> list[str]:
    names = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/comm") as comm:
            names.append(comm.read().strip())
    return sorted(names)


class RSSProbe(L.Callback):
    """Resident memory after the warm-up step, at the end, and the highest value seen after the warm-up."""

    def __init__(self) -> None:
        self.after_warm_up = 0
        self.peak = 0
        self.final = 0
        self.seconds = 0.0

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        step = trainer.global_step
        if step == WARM_UP:
            gc.collect()
            self.after_warm_up = rss_bytes()
            self._start = time.perf_counter()
        elif step > WARM_UP and step % 100 == 0:
            self.peak = max(self.peak, rss_bytes())

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        gc.collect()
        self.final = rss_bytes()
        self.seconds = time.perf_counter() - self._start


def test_memory_is_flat_over_2000_steps() -> None:
    probe = RSSProbe()
    started = time.perf_counter()
    strategy = ORTStrategy(intra_op_num_threads=1, mode="ort")  # ORT at every step, however fast
    result = fit(MLP(width=16), mlp_loader(batch_size=8), strategy, STEPS, callbacks=[probe])
    seconds = time.perf_counter() - started
    assert result.reports[0].ort_calls == STEPS and result.reports[0].torch_calls == 0
    growth = (probe.final - probe.after_warm_up) / probe.after_warm_up
    peak_growth = (probe.peak - probe.after_warm_up) / probe.after_warm_up
    print(
        f"\n{STEPS} steps in {seconds:.1f}s; RSS after {WARM_UP} steps {probe.after_warm_up / 2**20:.1f} MiB, "
        f"at the end {probe.final / 2**20:.1f} MiB ({growth:+.2%}), peak {probe.peak / 2**20:.1f} MiB "
        f"({peak_growth:+.2%})"
    )
    assert growth <= 0.05 and peak_growth <= 0.05
    assert all(torch.isfinite(torch.tensor(result.losses)))


def resources() -> tuple[int, int, int]:
    gc.collect()
    return open_fds(), threading.active_count(), native_threads()


class Predicting(MLP):
    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])


def train_and_validate() -> None:
    model = Predicting()
    result = fit(model, mlp_loader(), "ort", max_steps=5, val=mlp_loader(n=32), val_check_interval=5)
    assert result.reports[0].ort_calls == 5 + 2
    predictions = result.trainer.predict(model, mlp_loader(n=32))
    assert predictions is not None and len(predictions) == 2
    assert result.trainer.strategy.ort_reports[-1].ort_calls == 2


def _fitted_references() -> tuple[weakref.ref[Any], weakref.ref[Any]]:
    model = Predicting()
    result = fit(model, mlp_loader(), "ort", max_steps=3)
    assert result.reports[0].ort_calls == 3
    return weakref.ref(model), weakref.ref(result.trainer)


def test_finished_fits_leave_no_model_or_trainer_alive() -> None:
    """lightning_ort's record of what each export read held the modules strongly from a weakly keyed table,
    so every fit's model, Trainer, optimizer state and data lived as long as the process (a sweep or a
    notebook grew by the model's size at every fit)."""
    references = [_fitted_references() for _ in range(3)]
    gc.collect()
    alive = [kind for model, trainer in references for kind, ref in (("model", model), ("trainer", trainer)) if ref()]
    assert not alive, f"{len(alive)} of 6 still alive: {alive}"


def test_repeated_fits_leak_no_files_or_threads() -> None:
    train_and_validate()  # warm-up: ORT's import, extensions and first sessions
    before = resources()
    names_before = native_thread_names()
    for _ in range(3):
        train_and_validate()
    after = resources()
    deadline = time.monotonic() + 5  # a thread still on its way out is not a leak
    while after != before and time.monotonic() < deadline:
        time.sleep(0.1)
        after = resources()
    print(f"\n(fds, Python threads, native threads) before {before}, after 3 more fits {after}")
    assert after == before, f"threads before: {names_before}, after: {native_thread_names()}"
