"""Precision with ORTStrategy: 32-true in ORT, mixed precision never silently wrong, others rejected."""

from __future__ import annotations

import re
import warnings

import lightning as L
import pytest
import torch
from helpers import (
    assert_losses_match,
    assert_ort_ran,
    assert_states_match,
    fit,
    fit_both,
    skip_unless_eager_runs_in_bfloat16,
    trainer_kwargs,
)
from models import CNN, MLP, SequenceClassifier, image_loader, mlp_loader, varying_sequences
from torch import nn

from lightning_ort import ORTStrategy
from lightning_ort.precision import ORTPrecision


def test_bf16_mixed_on_cpu_falls_back_naming_the_missing_kernel() -> None:
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        eager, ort = fit_both(MLP, mlp_loader, 6, precision="bf16-mixed", strategy=ORTStrategy(fullgraph=True))
    assert isinstance(ort.trainer.strategy.precision_plugin, ORTPrecision)
    (report,) = ort.reports
    assert report.fallback_reason is not None
    assert re.search(
        r"Could not find an implementation for \w+\(\d+\).*no torch.bfloat16 kernel", report.fallback_reason
    )
    assert sum("ORT cannot run" in str(r.message) for r in records) == 1
    # PyTorch trained it under the same autocast: exactly the eager bf16 result
    assert_losses_match(eager, ort, rtol=0)
    assert_states_match(eager, ort, atol=0, rtol=0)


class TopFeaturesCNN(CNN):
    """Keeps the two strongest channels at each position (ORT's TopK has no bfloat16 type)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.features(x)
        return self.classifier(features * (features >= features.topk(2, dim=1).values[:, -1:]))


def test_bf16_mixed_on_cpu_names_autocast_when_ort_rejects_the_type() -> None:
    eager, ort = fit_both(
        TopFeaturesCNN,
        image_loader,
        4,
        precision="bf16-mixed",
        strategy=ORTStrategy(fullgraph=True, channels_last=False),
    )
    (report,) = ort.reports
    reason = report.fallback_reason
    assert reason is not None and "TopK" in reason and "under torch.bfloat16 autocast" in reason, reason
    assert "precision='32-true' keeps the module in ORT" in reason
    assert_losses_match(eager, ort, rtol=0)
    assert_states_match(eager, ort, atol=0, rtol=0)


class ChannelsLastCNN(CNN):
    """The same network, trained eagerly in channels-last memory."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.contiguous(memory_format=torch.channels_last))


def test_bf16_mixed_on_cpu_trains_in_ort_when_every_layer_runs_torch_kernels() -> None:
    """Convolutions, BatchNorm, ReLU and linear layers run on torch's kernels (op_rewrites), which
    have bfloat16 versions: ORT trains the autocast graph, with eager's result in standard memory,
    and in channels-last memory with the result of eager in channels-last memory (whose bfloat16
    kernels sum in another order: on an AVX2-only CPU its weights moved 0.03 away from standard
    memory's in 8 steps)."""
    eager, ort = fit_both(CNN, image_loader, 8, precision="bf16-mixed", strategy=ORTStrategy(channels_last=False))
    assert_ort_ran(ort, 8)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    torch.manual_seed(0)
    model = CNN()
    reference = ChannelsLastCNN().to(memory_format=torch.channels_last)
    reference.load_state_dict(model.state_dict())
    eager = fit(reference, image_loader(), "auto", 8, precision="bf16-mixed")
    ort = fit(model, image_loader(), "ort", 8, precision="bf16-mixed")
    assert_ort_ran(ort, 8)
    assert_losses_match(eager, ort, rtol=0)
    assert_states_match(eager, ort, atol=0, rtol=0)


def test_32_true_trains_in_ort_with_gradient_clipping() -> None:
    eager, ort = fit_both(CNN, image_loader, 12, gradient_clip_val=0.05)
    assert_ort_ran(ort, 12)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


@pytest.mark.parametrize("precision", ["64-true", "bf16-true", "16-true", "transformer-engine"])
def test_unsupported_precisions_are_rejected_before_training(precision: str) -> None:
    with pytest.raises((ValueError, ImportError), match=r"ORTStrategy does not support precision|transformer.engine"):
        L.Trainer(strategy=ORTStrategy(), precision=precision, **trainer_kwargs())


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_supported_precisions_are_accepted(precision: str) -> None:
    trainer = L.Trainer(strategy="ort", precision=precision, **trainer_kwargs())
    assert trainer.strategy.precision_plugin is not None


class LSTMTagger(SequenceClassifier):
    """An LSTM (or GRU) and a linear head over its outputs."""

    def __init__(self, cell: str) -> None:
        super().__init__()
        self.rnn = getattr(nn, cell)(8, 16, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0][:, -1]).float()


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_bf16_mixed_recurrent_layer_before_a_linear_layer_trains_in_ort(cell: str) -> None:
    """Eager runs the LSTM in bfloat16 under autocast, ONNX's LSTM in float32: its outputs are cast to the
    traced type, or the linear layer's backward met float32 and bfloat16 ("expected m1 and m2 ...")."""
    skip_unless_eager_runs_in_bfloat16(LSTMTagger(cell), next(iter(varying_sequences()))[0])
    eager, ort = fit_both(lambda: LSTMTagger(cell), varying_sequences, 4, precision="bf16-mixed")
    assert_ort_ran(ort, 4)
    # ORT's LSTM computes in float32 where eager's computes in bfloat16
    assert_losses_match(eager, ort, rtol=2e-2)
    assert_states_match(eager, ort, atol=2e-2, rtol=2e-2)
