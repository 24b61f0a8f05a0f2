"""Submodules, parameters and buffers replaced by new objects outside ``forward`` (``self.center = ...`` in
``training_step``, DINO's centring; a callback swapping a layer), and a submodule's code replaced (its
``forward`` set on the instance, its class swapped): ORT kept reading the objects of its first call, or
running the first code, so training went on silently with the old values."""

from __future__ import annotations

import types
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base, sequence_batches
from torch import nn

STEPS = 4


class Centre(nn.Module):
    """Subtracts a centre kept as a buffer and scales by a Python number (read by the trace)."""

    def __init__(self, scale: float = 1.0, width: int = 3) -> None:
        super().__init__()
        self.scale = scale
        self.register_buffer("center", torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.center) * self.scale


class Sharpened(Centre):
    """Another forward for the same state."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x - self.center) * 2.0


class Centred(Base):
    """``how`` is what ``training_step`` replaces after the forward."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.inner, self.head = nn.Linear(8, 16), nn.Linear(16, 3)
        self.centre = Centre()
        self.register_buffer("shift", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.centre(self.head(torch.tanh(self.inner(x)).mean(1))) - self.shift

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        logits = self(batch[0])
        with torch.no_grad():
            mean = logits.mean(0)
            if self.how == "own-buffer":
                self.shift = 0.5 * self.shift + 0.5 * mean
            elif self.how == "submodule-buffer":
                self.centre.center = 0.5 * self.centre.center + 0.5 * mean
            elif self.how == "submodule":  # another scale, which the graph holds as a constant
                self.centre = Centre(scale=1.0 + 0.5 * (batch_idx + 1))
            elif self.how == "buffer-shape":  # (3,) -> (1, 3): the graph's input shape changes
                self.shift = (0.5 * self.shift + 0.5 * mean).reshape(1, 3)
            elif self.how == "instance-forward" and batch_idx == 1:  # the submodule's code, not its state
                self.centre.forward = types.MethodType(Sharpened.forward, self.centre)
            elif self.how == "class" and batch_idx == 1:
                self.centre.__class__ = Sharpened
        return F.cross_entropy(logits, batch[1])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", F.cross_entropy(self(batch[0]), batch[1]))


class ReplaceHead(L.Callback):
    """Gives the model a new head parameter (a new object, the optimizer's still the old one) mid-training."""

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, index: int) -> None:
        if index == 2:
            pl_module.head.bias = nn.Parameter(pl_module.head.bias.detach() + 1.0)


def _batches() -> Any:
    return sequence_batches([(4, 6), (2, 9), (3, 5), (4, 7)], 8)


@pytest.mark.parametrize(
    "how", ["own-buffer", "submodule-buffer", "submodule", "buffer-shape", "instance-forward", "class"]
)
def test_state_replaced_in_training_step_is_what_ort_reads(how: str) -> None:
    eager, ort = fit_both(lambda: Centred(how), _batches, STEPS, val=_batches(), val_check_interval=2)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    val_loss = float(eager.trainer.callback_metrics["val_loss"])
    assert float(ort.trainer.callback_metrics["val_loss"]) == pytest.approx(val_loss, rel=1e-5)


def test_a_parameter_replaced_by_a_callback_is_what_ort_reads_and_gets_gradients() -> None:
    eager, ort = fit_both(lambda: Centred("nothing"), _batches, STEPS, callbacks=[ReplaceHead()])
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    assert ort.model.head.bias.grad is not None
    torch.testing.assert_close(ort.model.head.bias.grad, eager.model.head.bias.grad)
