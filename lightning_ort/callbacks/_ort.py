"""What the callbacks need from a running ORT strategy: its modules, their reports, and a way around ORT."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lightning_ort import engine
from lightning_ort.guard import ORTGuard
from lightning_ort.report import ORTModuleReport


@runtime_checkable
class ORTRunStrategy(Protocol):
    """What the callbacks use of a strategy that runs modules in ORT (``ORTStrategy`` and its variants)."""

    runtime_options: engine.ORTRuntimeOptions

    @property
    def ort_modules(self) -> dict[str, torch.nn.Module]: ...

    @property
    def ort_reports(self) -> list[ORTModuleReport]: ...


def ort_strategy(trainer: pl.Trainer, callback: str) -> ORTRunStrategy | None:
    """The Trainer's ORT strategy, or ``None`` after warning that ``callback`` has nothing to do."""
    strategy = trainer.strategy
    if isinstance(strategy, ORTRunStrategy):
        return strategy
    rank_zero_warn(
        f"lightning_ort: {callback} does nothing: the Trainer's strategy is {type(strategy).__name__}, "
        "which does not run modules in ONNX Runtime. Fix: Trainer(strategy='ort')."
    )
    return None


def reports_by_name(strategy: ORTRunStrategy) -> dict[str, ORTModuleReport]:
    """The latest report of each wrapped module name in the current or last run."""
    return {report.name: report for report in strategy.ort_reports}


def owner_of(pl_module: pl.LightningModule, name: str) -> torch.nn.Module:
    """The module whose ``forward`` ORT runs under ``name`` (``"forward"`` is the LightningModule itself)."""
    return pl_module if name == "forward" else pl_module.get_submodule(name)


@contextlib.contextmanager
def ort_bypassed(pl_module: pl.LightningModule) -> Iterator[None]:
    """Inside the block every wrapped module runs its own class's ``forward`` in PyTorch.

    ORT's graphs, the guards' call counts and fallback decisions are left untouched.
    """
    guards = [
        module.__dict__["forward"]
        for module in pl_module.modules()
        if isinstance(module.__dict__.get("forward"), ORTGuard)
    ]
    with contextlib.ExitStack() as stack:
        for guard in guards:
            stack.enter_context(guard.bypassed())
        yield
