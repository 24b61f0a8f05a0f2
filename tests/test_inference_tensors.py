"""Tensors made under ``torch.inference_mode`` (a torchmetrics state updated in ``Trainer.validate``)
have no version counter; reading it made every later ORT run of the model fall back to PyTorch
("Inference tensors do not track version counter")."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
import torchmetrics
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit, trainer_kwargs
from models import MLP, mlp_loader

STEPS = 3


class MeasuredMLP(MLP):
    """Updates an accuracy metric in its validation steps and keeps a plain tensor attribute there."""

    def __init__(self) -> None:
        super().__init__()
        self.accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=3)
        self.last_logits = torch.zeros(1)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.accuracy(logits, y)
        self.last_logits = logits.mean().reshape(1)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", self.accuracy)


def _validate_then_fit(strategy: str) -> tuple[Any, dict[str, float]]:
    torch.manual_seed(0)
    model = MeasuredMLP()
    L.Trainer(strategy=strategy, **trainer_kwargs(limit_val_batches=2)).validate(model, mlp_loader(), verbose=False)
    run = fit(model, mlp_loader(), strategy, STEPS, val=mlp_loader(), val_check_interval=STEPS)
    metrics = {key: float(value) for key, value in run.trainer.callback_metrics.items()}
    return run, metrics


def test_validate_with_a_metric_before_fit_keeps_training_in_ort() -> None:
    eager, eager_metrics = _validate_then_fit("auto")
    ort, ort_metrics = _validate_then_fit("ort")
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    assert ort_metrics.keys() == eager_metrics.keys() and "val_acc" in ort_metrics
    for key, value in eager_metrics.items():
        assert abs(ort_metrics[key] - value) <= 1e-5, key
