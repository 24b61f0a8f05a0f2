"""Inputs that change during a run: each trains in ORT like eager PyTorch (re-exporting when the input
schema changes) or falls back with a warning; never a wrong result."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import RunResult, assert_losses_match, assert_ort_ran, assert_states_match, fit
from models import CNN, MLP, Base, image_loader, mlp_loader
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_ort import engine

ATOL = 1e-5


class Recording:
    """Keeps every forward output of the steps (training, validation, predict) for comparison."""

    def record(self, kind: str, output: torch.Tensor) -> torch.Tensor:
        self.__dict__.setdefault("outputs", {}).setdefault(kind, []).append(output.detach().clone())
        return output


class TokenModel(Recording, Base):
    """Dict input: ``ids`` (any length, int32 or int64) and, optionally, a per-sample ``scale``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = self.embed(batch["ids"])
        if "scale" in batch:  # a key that appears mid-run (structure, not tensor values: safe to trace)
            hidden = hidden * batch["scale"][:, None, None]
        return self.head(hidden.mean(1))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self.record("train", self(batch)), batch["y"])

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", F.cross_entropy(self.record("val", self(batch)), batch["y"]))


class TokenBatches(Dataset):
    """Whole batches of 4 sequences; the length changes every batch; from ``change_at`` on, ``change`` applies."""

    def __init__(self, change: str | None = None, change_at: int = 4, n: int = 8) -> None:
        self.change, self.change_at, self.n = change, change_at, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        batch = {
            "ids": torch.randint(0, 50, (4, 3 + 2 * (i % 4)), generator=g),
            "y": torch.randint(0, 2, (4,), generator=g),
        }
        if i >= self.change_at and self.change == "new_key":
            batch["scale"] = torch.rand(4, generator=g) + 0.5
        if i >= self.change_at and self.change == "int32":
            batch["ids"] = batch["ids"].int()
        if i % 2 and self.change == "alternating":
            batch["ids"] = batch["ids"].int()
            batch["scale"] = torch.rand(4, generator=g) + 0.5
        return batch


def token_loader(change: str | None = None) -> DataLoader:
    return DataLoader(TokenBatches(change), batch_size=None)


class CastingMLP(Recording, MLP):
    """Accepts float64 input by casting to the weights' dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x.to(self.head.weight.dtype)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.record("train", self(x)), y)


class RecordingCNN(Recording, CNN):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.record("train", self(x)), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.record("val", self(x)), y))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.record("predict", self(batch[0]))


class SelfDistillingCNN(RecordingCNN):
    """Each training step also runs the model in eval mode without gradients (BatchNorm's running statistics)."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        with torch.no_grad():
            self.eval()
            target = self.record("teacher", self(x)).softmax(-1)
            self.train()
        logits = self.record("train", self(x))
        return F.cross_entropy(logits, y) + 0.5 * F.cross_entropy(logits, target)


class MixedPrecisionBatches(Dataset):
    """MLP batches: float32 for the first four, float64 afterwards."""

    def __init__(self) -> None:
        self.loader = list(mlp_loader(batch_size=8, n=64))

    def __len__(self) -> int:
        return len(self.loader)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.loader[i]
        return (x.double() if i >= 4 else x), y


class ExportCounter(L.Callback):
    """Counts the distinct ONNX graphs ORT exported, per mode (a re-export replaces the graph)."""

    def __init__(self) -> None:
        self.graphs: dict[bool, list[Any]] = {True: [], False: []}

    def _look(self, trainer: L.Trainer) -> None:
        for module in getattr(trainer.strategy, "ort_modules", {}).values():
            for training, seen in self.graphs.items():
                graph = engine.exported_model(module, training)
                if graph is not None and not any(graph is other for other in seen):
                    seen.append(graph)  # kept alive so that `is` stays meaningful

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._look(trainer)

    def on_validation_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._look(trainer)

    def on_predict_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._look(trainer)

    @property
    def exports(self) -> tuple[int, int]:
        """(training graphs, inference graphs)."""
        return len(self.graphs[True]), len(self.graphs[False])


@dataclass
class Comparison:
    eager: RunResult
    ort: RunResult
    exports: tuple[int, int]
    warnings: list[str] = field(default_factory=list)

    def outputs(self, kind: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return self.eager.model.outputs[kind], self.ort.model.outputs[kind]


def compare(
    make_model: Callable[[], L.LightningModule], make_loader: Callable[[], DataLoader], max_steps: int, **overrides: Any
) -> Comparison:
    """Train identical copies eagerly and under "ort"; check losses, every output and the final state."""
    torch.manual_seed(0)
    model = make_model()
    twin = copy.deepcopy(model)
    eager = fit(model, make_loader(), "auto", max_steps, **copy.copy(overrides))
    counter = ExportCounter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ort = fit(twin, make_loader(), "ort", max_steps, callbacks=[counter], **overrides)
    messages = [str(w.message) for w in caught if "lightning_ort" in str(w.message)]
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    for kind, expected in eager.model.outputs.items():
        got = ort.model.outputs[kind]
        assert len(got) == len(expected), kind
        for step, (a, b) in enumerate(zip(expected, got, strict=True)):
            assert a.dtype == b.dtype and a.shape == b.shape, (kind, step)
            torch.testing.assert_close(b, a, atol=ATOL, rtol=1e-4, msg=lambda m, k=kind, s=step: f"{k} {s}: {m}")
    return Comparison(eager, ort, counter.exports, messages)


def test_smaller_last_batch_and_train_eval_switches() -> None:
    """BatchNorm CNN, 100 samples in batches of 16 (last one 4), validation every 3 steps (last batch 8)."""
    result = compare(
        RecordingCNN,
        lambda: image_loader(batch_size=16, n=100),
        max_steps=14,
        val=image_loader(batch_size=16, n=40),
        val_check_interval=3,
        limit_val_batches=None,
    )
    assert_ort_ran(result.ort, min_calls=14 + 4 * 3)
    assert len(result.ort.model.outputs["val"]) == 4 * 3  # after batches 3 and 6 of both epochs, 3 batches each
    assert {out.shape[0] for out in result.ort.model.outputs["train"]} == {16, 4}
    assert result.exports == (1, 1)  # the batch axis is dynamic: one graph per mode
    assert not result.warnings


def test_eval_mode_forward_inside_the_training_step() -> None:
    result = compare(SelfDistillingCNN, lambda: image_loader(batch_size=16, n=100), max_steps=7)
    assert_ort_ran(result.ort, min_calls=2 * 7)
    assert result.exports == (1, 1)
    assert not result.warnings


def test_predict_after_training_matches_eager() -> None:
    torch.manual_seed(0)
    model = RecordingCNN()
    twin = copy.deepcopy(model)
    eager = fit(model, image_loader(n=64), "auto", max_steps=4)
    ort = fit(twin, image_loader(n=64), "ort", max_steps=4)
    for result in (eager, ort):
        result.trainer.predict(result.model, image_loader(batch_size=16, n=40))  # 16, 16, 8
    expected, got = model.outputs["predict"], twin.outputs["predict"]
    assert [p.shape[0] for p in got] == [16, 16, 8]
    for a, b in zip(expected, got, strict=True):
        torch.testing.assert_close(b, a, atol=ATOL, rtol=1e-4)
    assert ort.trainer.strategy.ort_reports[-1].ort_calls == 3


def test_varying_sequence_lengths() -> None:
    result = compare(TokenModel, token_loader, max_steps=8)
    assert_ort_ran(result.ort, min_calls=8)
    assert {out.shape for out in result.ort.model.outputs["train"]} == {torch.Size([4, 2])}
    assert result.exports == (1, 0)  # the sequence axis is dynamic too
    assert not result.warnings


class AttentionTokenModel(Recording, Base):
    """Attention over sequences whose length changes every batch: an encoder layer with a padding
    mask or a causal mask, cross-attention to a memory of another length, attention weights, and a
    sequence-first decoder layer (torch's default layout; causal self-attention and cross-attention)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.embed = nn.Embedding(50, 16)
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.cross = nn.MultiheadAttention(16, 2, batch_first=True)
        self.decoder = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0)
        self.head = nn.Linear(16, 2)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = batch["ids"]
        x = self.embed(ids)
        if self.kind == "decoder":
            mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
            memory = self.embed(ids[:, 1:]).transpose(0, 1)
            x = self.decoder(x.transpose(0, 1), memory, tgt_mask=mask, memory_key_padding_mask=ids[:, 1:] == 0)
            x = x.transpose(0, 1)
        elif self.kind == "padding":
            x = self.layer(x, src_key_padding_mask=ids == 0)
        elif self.kind == "causal":
            mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
            x = self.layer(x, src_mask=mask, is_causal=True)
        elif self.kind == "cross":
            memory = self.embed(ids[:, 1:])
            x = x + self.cross(x, memory, memory, key_padding_mask=ids[:, 1:] == 0, need_weights=False)[0]
        else:  # nn.MultiheadAttention's default need_weights=True, the averaged weights used too
            attended, weights = self.cross(x, x, x, key_padding_mask=ids == 0)
            x = attended + weights.mean(-1, keepdim=True)
        return self.head(x.mean(1))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self.record("train", self(batch)), batch["y"])


@pytest.mark.parametrize("kind", ["padding", "causal", "cross", "weights", "decoder"])
def test_attention_with_varying_sequence_lengths_trains_in_ort_like_eager(kind: str) -> None:
    """torch's exporter would freeze nn.MultiheadAttention's sequence length (benchmarks/NOTES.md);
    lightning_ort's export keeps it dynamic, so one graph serves every length."""
    result = compare(lambda: AttentionTokenModel(kind), token_loader, max_steps=6)
    assert_ort_ran(result.ort, min_calls=6)
    assert result.exports == (1, 0)
    assert not result.warnings


def test_dict_input_that_gains_a_key() -> None:
    result = compare(lambda: TokenModel(), lambda: token_loader("new_key"), max_steps=8)
    assert_ort_ran(result.ort, min_calls=8)
    assert result.exports == (2, 0)  # ORT re-exports once when "scale" appears
    assert not result.warnings


def test_int32_ids_after_int64_ids() -> None:
    result = compare(TokenModel, lambda: token_loader("int32"), max_steps=8)
    assert_ort_ran(result.ort, min_calls=8)
    assert result.exports == (2, 0)  # a new input dtype is a new graph
    assert not result.warnings


def test_schema_alternating_every_step_re_exports_every_step() -> None:
    """Correct, but slow: ORT keeps one graph per mode, so each change of key set or dtype exports again."""
    result = compare(TokenModel, lambda: token_loader("alternating"), max_steps=8)
    assert_ort_ran(result.ort, min_calls=8)
    assert result.exports == (8, 0)
    assert not result.warnings


def test_float64_input_after_float32_input() -> None:
    result = compare(CastingMLP, lambda: DataLoader(MixedPrecisionBatches(), batch_size=None), max_steps=8)
    assert_ort_ran(result.ort, min_calls=8)
    assert result.exports == (2, 0)
    assert not result.warnings


def test_float64_input_into_float32_layers_fails_as_in_eager() -> None:
    """Eager PyTorch refuses the float64 batch; under ORT the same error stops the run (after ORT's warning)."""
    loader = DataLoader(MixedPrecisionBatches(), batch_size=None)
    with pytest.raises(RuntimeError) as eager_error:
        fit(MLP(), loader, "auto", max_steps=8)
    with pytest.warns(UserWarning, match="lightning_ort: ORT cannot run `forward`"):
        with pytest.raises(RuntimeError) as ort_error:
            fit(MLP(), loader, "ort", max_steps=8)
    assert str(ort_error.value) == str(eager_error.value)
