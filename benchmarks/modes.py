"""How one workload is trained in each benchmark mode; each returns per-step wall times."""

from __future__ import annotations

import resource
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import lightning as L
import torch
from torch import nn
from workloads import Batch, Workload, call

import lightning_ort
from lightning_ort import engine
from lightning_ort.timing import StepTimer

MODES = (
    "eager",
    "ort",
    "ort_auto",
    "ort_no_rewrites",
    "ort_no_arena",
    "ort_fused_attention",
    "raw_ort",
    "raw_eager",
    "compile",
)


class Steps(NamedTuple):
    """Per-step wall times (seconds) and minor page faults of one training run."""

    times: list[float]
    faults: list[int]
    choices: str = ""  # ort_auto: what mode="auto" chose per module, and ORT's measured speed


def minor_faults() -> int:
    """Minor page faults of this process so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class FaultCounter(L.Callback):
    """Minor page faults of every training batch (memory the step got back from the kernel)."""

    def __init__(self) -> None:
        self.faults: list[int] = []
        self._start = 0

    def on_train_batch_start(self, *args: Any) -> None:
        self._start = minor_faults()

    def on_train_batch_end(self, *args: Any) -> None:
        self.faults.append(minor_faults() - self._start)


class BenchModule(L.LightningModule):
    """The workload's model inside a LightningModule whose steps call ``self(x)``."""

    def __init__(self, workload: Workload, model: nn.Module) -> None:
        super().__init__()
        self.workload = workload
        self.model = model

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return self.workload.loss(call(self, x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.workload.make_optimizer(list(self.parameters()))


def _lightning(
    workload: Workload,
    model: nn.Module,
    batches: list[Batch],
    strategy: Any,
    device: str,
    callbacks: Sequence[L.Callback] = (),
) -> Steps:
    auto = isinstance(strategy, lightning_ort.ORTStrategy) and strategy.mode == "auto"
    timer, faults = StepTimer(warmup=0), FaultCounter()
    trainer = L.Trainer(
        accelerator=device,
        devices=1,
        strategy=strategy,
        max_steps=len(batches),
        callbacks=[timer, faults, *callbacks],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(BenchModule(workload, model), torch.utils.data.DataLoader(batches, batch_size=None))
    choices = []
    if isinstance(trainer.strategy, lightning_ort.ORTStrategy):
        for report in trainer.strategy.ort_reports:
            if report.fallback_reason is not None or report.eval_fallback_reason is not None:
                raise RuntimeError(f"ORT did not run {report.name}: {report.fallback_reason}")
            if auto:
                measured = report.measured_speedup
                speed = " (run too short to measure)" if measured is None else f" (ORT at {measured:.2f}x)"
                choices.append(f"{report.name}: {report.auto_choice}{speed}")
            elif report.torch_calls:
                raise RuntimeError(f"ORT did not run {report.name}: {report.torch_call_reasons}")
    return Steps(timer.step_times, faults.faults, ", ".join(choices))


def _to(x: Any, device: str) -> Any:
    return {key: value.to(device) for key, value in x.items()} if isinstance(x, dict) else x.to(device)


def _loop(workload: Workload, model: nn.Module, runner: nn.Module, batches: list[Batch], device: str) -> Steps:
    """A plain training loop without Lightning: ``runner`` (the model or its ORTModule) on every batch."""
    optimizer = workload.make_optimizer(list(model.parameters()))
    steps = Steps([], [])
    for x, y in batches:
        start, faults = time.perf_counter(), minor_faults()
        workload.train_step(runner, optimizer, (_to(x, device), y.to(device)))
        steps.times.append(time.perf_counter() - start)
        steps.faults.append(minor_faults() - faults)
    return steps


def _raw_ort(workload: Workload, model: nn.Module, batches: list[Batch], device: str, options: Any) -> Steps:
    model = model.to(device)
    return _loop(workload, model, engine.wrap_module(model, options), batches, device)


def run_mode(
    mode: str,
    workload: Workload,
    batches: list[Batch],
    device: str,
    ort_options: dict[str, Any],
    callbacks: Sequence[L.Callback] = (),
) -> Steps:
    """Train ``workload`` on ``batches`` in ``mode``; the per-step wall times and page faults.

    ``callbacks`` join the Trainer of the Lightning modes."""
    torch.manual_seed(0)
    model = workload.make_model()
    if mode == "eager":
        return _lightning(workload, model, batches, "auto", device, callbacks)
    if mode == "ort":  # mode="ort" named, whatever the strategy's default mode
        strategy = lightning_ort.ORTStrategy(**{"mode": "ort", **ort_options})
        return _lightning(workload, model, batches, strategy, device, callbacks)
    if mode == "ort_auto":  # mode="auto": ORT and eager timed on the first steps, the faster kept
        strategy = lightning_ort.ORTStrategy(**{**ort_options, "mode": "auto"})
        return _lightning(workload, model, batches, strategy, device, callbacks)
    if mode == "ort_no_rewrites":  # the "before" of op_rewrites, side by side
        strategy = lightning_ort.ORTStrategy(**{**ort_options, "op_rewrites": False})
        return _lightning(workload, model, batches, strategy, device, callbacks)
    if mode == "ort_no_arena":  # torch kernels in ORT's graph allocate through malloc, as before memory_arena
        strategy = lightning_ort.ORTStrategy(**{**ort_options, "memory_arena": False})
        return _lightning(workload, model, batches, strategy, device, callbacks)
    if mode == "ort_fused_attention":  # attention written out by hand on torch's fused kernels
        strategy = lightning_ort.ORTStrategy(**{**ort_options, "fuse_attention": True})
        return _lightning(workload, model, batches, strategy, device, callbacks)
    if mode == "raw_ort":
        runtime = lightning_ort.ORTStrategy(**ort_options).runtime_options
        return _raw_ort(workload, model, batches, device, runtime)
    if mode == "raw_eager":  # the same loop as raw_ort, in eager PyTorch: what Lightning's own loop costs
        model = model.to(device)
        return _loop(workload, model, model, batches, device)
    if mode == "compile":
        return _lightning(workload, torch.compile(model), batches, "auto", device, callbacks)
    raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
