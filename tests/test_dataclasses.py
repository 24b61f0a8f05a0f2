"""Dataclass instances as a forward's inputs and outputs train in ORT (ORT itself flattens only tensors,
sequences and mappings, and fell back to PyTorch on them)."""

from __future__ import annotations

import copy
import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit, fit_both
from models import Base, sequence_batches
from torch import nn

import lightning_ort
from lightning_ort.engine.export import export_cache


@dataclasses.dataclass
class Batch:
    tokens: torch.Tensor
    mask: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class Output:
    logits: torch.Tensor
    hidden: torch.Tensor
    aux: torch.Tensor | None = None
    norm: torch.Tensor = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "norm", self.hidden.pow(2).mean())


class WithDataclasses(Base):
    """Takes a :class:`Batch` and returns an :class:`Output` (or, with ``nested``, a tuple holding one)."""

    def __init__(self, nested: bool = False) -> None:
        super().__init__()
        self.nested = nested
        self.inner, self.head = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, batch: Batch) -> Any:
        hidden = torch.tanh(self.inner(batch.tokens))
        if batch.mask is not None:
            hidden = hidden * batch.mask.unsqueeze(-1)
        output = Output(self.head(hidden.mean(1)), hidden)
        return (hidden.sum(), [output]) if self.nested else output

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        output = self(Batch(x, (x[..., 0] > -1).float()))
        if self.nested:
            total, (output,) = output
            assert isinstance(total, torch.Tensor)
        assert type(output) is Output and output.aux is None
        return F.cross_entropy(output.logits, y) + 0.1 * output.norm

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        output = self(Batch(batch[0]))
        self.log("val_logit", output[1][0].logits.mean() if self.nested else output.logits.mean())


def _batches() -> Any:
    return sequence_batches([(4, 6), (2, 9), (3, 5)], 8)


@pytest.mark.parametrize("nested", [False, True], ids=["dataclass", "nested-in-tuple-and-list"])
def test_dataclass_input_and_output_train_in_ort(nested: bool) -> None:
    eager, ort = fit_both(lambda: WithDataclasses(nested), _batches, 3, val=_batches())
    assert_ort_ran(ort, 3)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    val_logit = float(eager.trainer.callback_metrics["val_logit"])
    assert float(ort.trainer.callback_metrics["val_logit"]) == pytest.approx(val_logit, rel=1e-5)


def test_a_cached_export_gives_back_the_dataclass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(export_cache, "cache_root", lambda: tmp_path)
    torch.manual_seed(0)
    model = WithDataclasses()
    twin, eager_model = copy.deepcopy(model), copy.deepcopy(model)
    fit(model, _batches(), lightning_ort.ORTStrategy(export_cache=True), 3)
    with caplog.at_level(logging.INFO, logger="lightning_ort"):
        run = fit(twin, _batches(), lightning_ort.ORTStrategy(export_cache=True), 3)
    assert "reused the cached ONNX export" in caplog.text
    eager = fit(eager_model, _batches(), "auto", 3)
    assert_ort_ran(run, 3)
    assert_losses_match(eager, run)
    assert_states_match(eager, run)
