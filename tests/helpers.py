"""Shared helpers: train the same model with and without ORT and compare."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

import lightning_ort


class LossRecorder(L.Callback):
    """Records the training loss of every step."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, *args: Any) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss.detach()))


@dataclass
class RunResult:
    losses: list[float]
    state: dict[str, torch.Tensor]
    trainer: L.Trainer
    model: L.LightningModule
    reports: list[lightning_ort.ORTModuleReport] = field(default_factory=list)

    def after(self, step: int) -> RunResult:
        """The same run with only the losses of the steps after ``step`` (to compare with a resumed run)."""
        return dataclasses.replace(self, losses=self.losses[step:])


def trainer_kwargs(**overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    kwargs.update(overrides)
    return kwargs


def fit(
    model: L.LightningModule,
    train: DataLoader,
    strategy: Any = "auto",
    max_steps: int = 16,
    val: DataLoader | None = None,
    ckpt_path: Any = None,
    **overrides: Any,
) -> RunResult:
    recorder = LossRecorder()
    callbacks = [recorder, *overrides.pop("callbacks", [])]
    if val is not None:
        overrides.setdefault("limit_val_batches", 2)
    trainer = L.Trainer(strategy=strategy, max_steps=max_steps, callbacks=callbacks, **trainer_kwargs(**overrides))
    trainer.fit(model, train, val, ckpt_path=ckpt_path)
    reports = list(trainer.strategy.ort_reports) if isinstance(trainer.strategy, lightning_ort.ORTStrategy) else []
    state = {key: value.detach().clone() for key, value in model.state_dict().items()}
    return RunResult(recorder.losses, state, trainer, model, reports)


def fit_both(
    make_model: Callable[[], L.LightningModule],
    make_loader: Callable[[], DataLoader],
    max_steps: int = 16,
    strategy: Any = "ort",
    **overrides: Any,
) -> tuple[RunResult, RunResult]:
    """Train identical copies eagerly and through ORT (same initial weights, same batches)."""
    torch.manual_seed(0)
    model = make_model()
    twin = copy.deepcopy(model)
    eager = fit(model, make_loader(), "auto", max_steps, **copy.copy(overrides))
    ort = fit(twin, make_loader(), strategy, max_steps, **overrides)
    return eager, ort


def skip_unless_eager_runs_in_bfloat16(model: torch.nn.Module, *inputs: Any) -> None:
    """Skip the test when eager PyTorch itself cannot run ``model`` (forward and backward) under CPU
    bfloat16 autocast on this CPU.

    Some of oneDNN's bfloat16 kernels (the LSTM's) exist only on CPUs with AVX-512 BF16 or AMX; on an
    AVX2-only CPU eager training fails before ORT is involved. Only that case skips: a failure on a CPU
    whose oneDNN supports bfloat16 fails the test.
    """
    probe = copy.deepcopy(model)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = probe(*inputs)
        output.float().sum().backward()
    except RuntimeError as err:
        if torch.ops.mkldnn._is_mkldnn_bf16_supported():
            raise
        pytest.skip(f"eager PyTorch cannot run this under bfloat16 autocast on this CPU (no oneDNN bfloat16): {err}")


def assert_ort_ran(result: RunResult, min_calls: int) -> None:
    """ORT executed the wrapped modules and never handed them to PyTorch."""
    assert result.reports, "no module was wrapped in ORT"
    for report in result.reports:
        assert report.fallback_reason is None, f"{report.name} fell back: {report.fallback_reason}"
        assert report.eval_fallback_reason is None, f"{report.name} fell back in eval: {report.eval_fallback_reason}"
        assert report.torch_calls == 0, f"{report.name} ran {report.torch_calls} calls in PyTorch"
    assert sum(report.ort_calls for report in result.reports) >= min_calls


def assert_losses_match(eager: RunResult, ort: RunResult, rtol: float = 1e-5) -> None:
    assert len(eager.losses) == len(ort.losses) >= 1
    for step, (a, b) in enumerate(zip(eager.losses, ort.losses, strict=True)):
        assert abs(a - b) <= rtol * max(abs(a), 1e-8), f"step {step}: eager {a} vs ORT {b}"


def assert_states_match(eager: RunResult, ort: RunResult, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """Weights and buffers (BatchNorm statistics, counters) agree, with exactly the same keys."""
    assert eager.state.keys() == ort.state.keys()
    for key, value in eager.state.items():
        other = ort.state[key]
        assert value.dtype == other.dtype and value.shape == other.shape, key
        torch.testing.assert_close(other, value, atol=atol, rtol=rtol, msg=lambda m, key=key: f"{key}: {m}")
