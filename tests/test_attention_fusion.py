"""Attention written out by hand runs as one fused attention node (attention_fusion.py).

Each model trains through ORT and eagerly on batches of varying size and length (one of length 1,
one with a single sequence), and is compared with eager PyTorch, weights included. The graph ORT
differentiated shows whether the chain was fused; chains that are not attention, or whose parts
are read elsewhere, keep their nodes and still match.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base
from torch import nn
from torch.utils.data import DataLoader

import lightning_ort
from lightning_ort import engine
from lightning_ort.engine.ops.kernels.gradient_overloads import aten_operator

STEPS = 8
WIDTH, HEADS = 16, 2


class ProcessedGraphRecorder(L.Callback):
    """The operators of the training graph ORT differentiates and of the inference graph it
    validates with (after lightning_ort's rewrites)."""

    def __init__(self) -> None:
        self.operators: set[str] = set()
        self.inference_operators: set[str] = set()

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if not self.operators:
            self.operators = _operators(trainer, training=True)

    def on_validation_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if not self.inference_operators:
            self.inference_operators = _operators(trainer, training=False)


def _operators(trainer: L.Trainer, training: bool) -> set[str]:
    if not isinstance(trainer.strategy, lightning_ort.ORTStrategy):
        return set()
    model = engine.processed_model(trainer.strategy.ort_modules["forward"], training=training)
    return {aten_operator(node) or node.op_type for node in model.graph.node}


class HandAttention(Base):
    """One attention layer written out by hand, in the form ``kind`` names, then a classifier."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.embed = nn.Embedding(40, WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.attn_dropout = nn.Dropout(0.0)
        self.head = nn.Linear(WIDTH, 3)
        if kind == "learned-scale":
            self.temperature = nn.Parameter(torch.tensor(0.3))
        self.register_buffer("causal", torch.tril(torch.ones(1, 1, 16, 16, dtype=torch.bool)), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        batch, length = ids.shape
        d = WIDTH // HEADS
        heads = self.qkv(self.embed(ids)).view(batch, length, 3, HEADS, d).permute(2, 0, 3, 1, 4)
        q, k, v = heads[0], heads[1], heads[2]
        extra = 0.0
        if self.kind == "chunked-heads-first":  # q, k, v each transposed to (batch, heads, length, dim)
            q, k, v = (
                part.view(batch, length, HEADS, d).transpose(1, 2) for part in self.qkv(self.embed(ids)).chunk(3, -1)
            )
        if self.kind in ("gpt", "chunked-heads-first"):  # examples/gpt, nanoGPT
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
            scores = scores.masked_fill(~self.causal[:, :, :length, :length], float("-inf"))
            weights = self.attn_dropout(F.softmax(scores, dim=-1))
        elif self.kind == "padding-divided":
            scores = q @ k.transpose(-2, -1) / math.sqrt(d)
            weights = scores.masked_fill((ids == 0)[:, None, None, :], float("-inf")).softmax(-1)
        elif self.kind == "unscaled":
            weights = torch.softmax(q @ k.mT, dim=3)
        elif self.kind == "scale-on-the-left":
            weights = (0.25 * (q @ k.transpose(-2, -1))).softmax(-1)
        elif self.kind == "multi-query":  # one key and value head for all query heads (broadcast)
            k, v = k[:, :1], v[:, :1]
            weights = (q @ k.transpose(-2, -1) * d**-0.5).softmax(-1)
        elif self.kind == "cross-attention":  # keys and values from a longer, padded memory
            memory = torch.cat([self.embed(ids.flip(1)), self.embed(ids)], 1)
            k, v = (self.qkv(memory).view(batch, 2 * length, 3, HEADS, d)[:, :, i].transpose(1, 2) for i in (1, 2))
            pad = torch.cat([ids.flip(1), ids], 1) == 0
            weights = (q @ k.transpose(-2, -1) / d**0.5).masked_fill(pad[:, None, None], float("-inf")).softmax(-1)
        elif self.kind == "single-head":  # (batch, length, dim) tensors, no head dimension
            q, k, v = q[:, 0], k[:, 0], v[:, 0]
            weights = (q @ k.transpose(-2, -1) * d**-0.5).softmax(-1)
            return self.head(self.proj((weights @ v).repeat(1, 1, HEADS)).mean(1))
        elif self.kind == "finite-fill":  # not attention's -inf: rows of all-masked keys differ
            scores = (q @ k.transpose(-2, -1)).masked_fill((ids == 0)[:, None, None, :], -1e4)
            weights = scores.softmax(-1)
        elif self.kind == "weights-read":  # the attention weights are read again: nothing is fused
            weights = (q @ k.transpose(-2, -1) * 0.3).softmax(-1)
            extra = weights.amax(-1).mean()
        elif self.kind == "learned-scale":  # a parameter, not a constant: not fused, and it gets its gradient
            weights = (q @ k.transpose(-2, -1) * self.temperature).softmax(-1)
        elif self.kind == "scale-after-fill":  # masked_fill before the scale: not fused
            scores = (q @ k.transpose(-2, -1)).masked_fill(~self.causal[:, :, :length, :length], float("-inf"))
            weights = (scores * 0.3).softmax(-1)
        else:
            raise ValueError(self.kind)
        out = (weights @ v).transpose(1, 2).reshape(batch, length, WIDTH)
        return self.head(self.proj(out).mean(1)) + extra

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", F.cross_entropy(self(batch[0]), batch[1]), batch_size=len(batch[0]))


def token_batches() -> DataLoader:
    """Token id batches of varying size and length, with padding (id 0) at the end of some
    sequences; every sequence keeps at least one token."""
    g = torch.Generator().manual_seed(0)
    batches = []
    for size, length in [(4, 7), (3, 5), (2, 1), (1, 9), (4, 16), (3, 7), (2, 3), (4, 12)]:
        ids = torch.randint(1, 40, (size, length), generator=g)
        if length > 2:
            ids[::2, -(length // 3) :] = 0
        batches.append((ids, torch.randint(0, 3, (size,), generator=g)))
    return DataLoader(batches, batch_size=None)


def _fit(kind: str, **options: Any) -> tuple[Any, Any, ProcessedGraphRecorder]:
    """Eager and ORT runs (SGD: an adaptive optimizer would amplify the rounding noise in the key
    bias's gradient, zero in exact arithmetic, into differences of the learning rate's size)."""
    recorder = ProcessedGraphRecorder()
    strategy = lightning_ort.ORTStrategy(**{"fuse_attention": True, **options})
    eager, ort = fit_both(lambda: HandAttention(kind), token_batches, STEPS, strategy=strategy, callbacks=[recorder])
    assert_ort_ran(ort, STEPS)
    return eager, ort, recorder


@pytest.mark.parametrize(
    "kind",
    [
        "gpt",
        "chunked-heads-first",
        "padding-divided",
        "unscaled",
        "scale-on-the-left",
        "multi-query",
        "cross-attention",
        "single-head",
    ],
)
def test_hand_written_attention_is_fused_and_matches_eager(kind: str) -> None:
    eager, ort, recorder = _fit(kind)
    assert "lightning_ort::attention" in recorder.operators
    assert not {"lightning_ort::softmax", "lightning_ort::masked_fill", "lightning_ort::matmul"} & recorder.operators
    if kind in ("gpt", "padding-divided", "unscaled", "scale-on-the-left"):
        # the packed split gives (batch, length, heads, dim) parts, and the output needs no transpose
        assert "lightning_ort::unbind3" in recorder.operators and "Transpose" not in recorder.operators
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


@pytest.mark.parametrize("kind", ["finite-fill", "weights-read", "scale-after-fill", "learned-scale"])
def test_chains_that_are_not_attention_keep_their_nodes(kind: str) -> None:
    eager, ort, recorder = _fit(kind)
    assert "lightning_ort::attention" not in recorder.operators
    assert "lightning_ort::softmax" in recorder.operators
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


@pytest.mark.parametrize(
    ("kind", "options"),
    [("gpt", {"fuse_attention": False}), ("unscaled", {"fuse_attention": False}), ("gpt", {"op_rewrites": False})],
)
def test_fusion_is_off_by_default_and_without_rewrites(kind: str, options: dict[str, bool]) -> None:
    """Off, the chain keeps its nodes (and ``k.mT``, which torch cannot export, still trains in ORT)."""
    eager, ort, recorder = _fit(kind, **options)
    assert "lightning_ort::attention" not in recorder.operators
    assert {"lightning_ort::softmax", "Softmax"} & recorder.operators
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_validation_runs_the_fused_inference_graph() -> None:
    """ORT's inference graph (no dropout node in eval mode) is fused as well, and validates like eager."""
    recorder = ProcessedGraphRecorder()
    eager, ort = fit_both(
        lambda: HandAttention("gpt"),
        token_batches,
        STEPS,
        strategy=lightning_ort.ORTStrategy(fuse_attention=True),
        callbacks=[recorder],
        val=token_batches(),
        val_check_interval=4,
    )
    assert_ort_ran(ort, STEPS)
    assert "lightning_ort::attention" in recorder.inference_operators
    assert "lightning_ort::softmax" not in recorder.inference_operators
    assert_losses_match(eager, ort)
    val_eager, val_ort = (float(run.trainer.callback_metrics["val_loss"]) for run in (eager, ort))
    assert abs(val_eager - val_ort) <= 1e-5 * abs(val_eager)
