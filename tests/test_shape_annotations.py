"""Shapes of lightning_ort's ATen operators in ORT's shape inference (shape_inference.py).

With the shapes known, a residual connection's gradient is passed on as it is, not summed back at
run time (``BroadcastGradientArgs`` + a ``ReduceSum`` copy each); broadcasts that do happen must
still be summed, as eager autograd does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from model import GPT
from models import Base, sequence_batches
from torch import nn
from torch.utils.data import DataLoader

import lightning_ort
from lightning_ort.callbacks import ONNXGraphDump


def varying_tokens() -> DataLoader:
    """Token windows whose batch size and length change every step, length 1 included; every other
    row ends in padding (token 0) from two thirds of its length on."""
    g = torch.Generator().manual_seed(0)
    batches = []
    for batch, length in [(4, 16), (3, 1), (2, 9), (4, 16), (5, 12), (1, 3)]:
        window = torch.randint(1, 40, (batch, length + 1), generator=g)
        window[1::2, max(1, 2 * length // 3) :] = 0
        batches.append((window[:, :-1], window[:, 1:]))
    return DataLoader(batches, batch_size=None)


def make_gpt() -> GPT:
    # positional embeddings and causal mask are fixed-size buffers cut to the sequence length
    return GPT(vocab_size=40, d_model=32, n_heads=4, n_layers=2, max_seq_len=16, lr=1e-3)


class PaddedEncoder(Base):
    """nn.TransformerEncoder with the padding mask of its token ids (0 pads), a language-model head."""

    lr = 0.01

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(40, 32)
        layer = nn.TransformerEncoderLayer(32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 40)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(ids), src_key_padding_mask=ids == 0))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        ids, target = batch
        return F.cross_entropy(self(ids).flatten(0, 1), target.flatten())


def training_graph_ops(directory: Path) -> list[str]:
    model = onnx.load(str(directory / "forward.training.4_optimized.onnx"))
    return [node.op_type for node in model.graph.node]


def test_transformer_gradients_sum_nothing_at_run_time(tmp_path: Path) -> None:
    """The GPT example and nn.TransformerEncoder with a padding mask: ORT's gradient graph knows that
    no residual Add broadcasts, and training still matches eager at every batch and sequence size.

    (Where the mask is a second input, as in EncoderClassifier, its sizes are other symbols than the
    token ids'; nothing says they are equal, so those gradients are still summed at run time.)"""
    for name, make_model, make_loader, steps in [
        ("gpt", make_gpt, varying_tokens, 6),
        ("encoder", PaddedEncoder, varying_tokens, 6),
    ]:
        dump = ONNXGraphDump(dirpath=tmp_path / name, stages=["optimized"])
        eager, ort = fit_both(make_model, make_loader, steps, callbacks=[dump])
        assert_ort_ran(ort, steps)
        assert_losses_match(eager, ort)
        assert_states_match(eager, ort, atol=1e-4)
        ops = training_graph_ops(tmp_path / name)
        assert "ATen" in ops, name
        assert "BroadcastGradientArgs" not in ops, name


class RealBroadcasts(Base):
    """Broadcasts after lightning_ort's operators that do happen: their gradients must be summed."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.offset = nn.Parameter(torch.randn(1, 1, 8))  # broadcast over batch and sequence
        self.gate = nn.Linear(8, 8)  # applied to the sequence mean: (batch, 1, 8)
        self.norm = nn.LayerNorm(8)
        self.memory = nn.Parameter(torch.randn(1, 5, 8))  # one memory for every sample: batch broadcast
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.proj(x) + self.offset
        hidden = hidden * F.gelu(self.gate(hidden.mean(1, keepdim=True)))
        scores = torch.softmax(self.norm(hidden) @ self.memory.transpose(-2, -1), dim=-1)
        hidden = hidden + F.relu(scores @ self.memory)
        return self.head(hidden.mean(1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


def sequences() -> DataLoader:
    return sequence_batches([(4, 6), (1, 6), (3, 1), (4, 6), (2, 9), (1, 1)], 8, seed=2)


def test_broadcasts_after_torch_kernels_are_summed() -> None:
    for options in [{}, {"op_rewrites": False}]:
        eager, ort = fit_both(RealBroadcasts, sequences, 6, strategy=lightning_ort.ORTStrategy(**options))
        assert_ort_ran(ort, 6)
        assert_losses_match(eager, ort)
        assert_states_match(eager, ort)


class UnflattenDecoder(Base):
    """A VAE-style decoder: a linear layer, ``nn.Unflatten`` to a feature map, a transposed
    convolution and BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.project = nn.Linear(8, 4 * 3 * 3)
        self.decode = nn.Sequential(nn.Unflatten(1, (4, 3, 3)), nn.ConvTranspose2d(4, 2, 2, 2), nn.BatchNorm2d(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.project(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, target = batch
        return F.mse_loss(self(x), target)


def test_unflatten_before_batch_norm_trains_in_ort() -> None:
    # torch exports unflatten's dimension through a Mod that ORT's inference did not evaluate; the
    # reshape's shape had an unknown length, the inference failed, and the graph build after it did
    # too (BatchNorm's extra outputs had no type): the model fell back
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(batch, 8, generator=g), torch.randn(batch, 2, 6, 6, generator=g)) for batch in (4, 3, 4, 2)]
    eager, ort = fit_both(UnflattenDecoder, lambda: DataLoader(batches, batch_size=None), 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class ReversibleNorm(Base):
    """RevIN, as forecasting models (PatchTST, Non-stationary Transformer) write it: statistics over the
    length, detached, added back to a forecast of another length. ORT's inference gave the kept 1 of the
    detached statistic a new symbol and merged it with both lengths: the input's length was read as the
    horizon's (losses 6.5 times eager's)."""

    def __init__(self, statistic: str) -> None:
        super().__init__()
        self.statistic = statistic
        self.head = nn.Linear(8, 4 * 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, channels = x.shape
        if self.statistic == "mean":
            center = x.mean(1, keepdim=True).detach()
        elif self.statistic == "amax":
            center = x.amax(1, keepdim=True).detach()
        else:
            center = x.std(1, keepdim=True).detach()
        features = (x - center).abs().sum(1) / length
        return self.head(features).view(batch, 4, channels) + center

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0]).pow(2).mean()


@pytest.mark.parametrize("statistic", ["mean", "amax", "std"])
def test_a_detached_statistic_added_to_another_length_keeps_the_input_length(statistic: str) -> None:
    lengths = lambda: sequence_batches([(4, 12), (3, 16), (5, 10)], 8, seed=3)  # noqa: E731
    eager, ort = fit_both(lambda: ReversibleNorm(statistic), lengths, 3)
    assert_ort_ran(ort, 3)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
