"""Packed q/k/v projections taken apart by one ``lightning_ort::unbind*`` node (unbind.py) train like eager."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base, sequence_batches
from torch import nn
from torch.utils.data import DataLoader

from lightning_ort import engine
from lightning_ort.callbacks import ONNXGraphDump
from lightning_ort.engine.bootstrap.extensions import load_aten_ops


class PackedHeads(Base):
    """nanoGPT-style attention: one projection for q, k and v, taken apart after a permute."""

    lr = 0.01

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.parts = 2 if kind == "kv" else 3
        self.packed = nn.Linear(16, 16 * self.parts)
        self.query = nn.Linear(16, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        packed = self.packed(x).view(batch, length, self.parts, 4, 4).permute(2, 0, 3, 1, 4)
        if self.kind == "qkv":
            q, k, v = packed[0], packed[1], packed[2]
        elif self.kind == "negative-index":
            q, k, v = packed[-3], packed[-2], packed[-1]
        elif self.kind == "detached-key":
            q, k, v = packed[0], packed[1].detach(), packed[2]
        elif self.kind == "kv":
            q = self.query(x).view(batch, length, 4, 4).transpose(1, 2)
            k, v = packed[0], packed[1]
        else:  # "partial": the key comes from elsewhere, so the packed tensor is not taken apart whole
            q, v = packed[0], packed[2]
            k = self.query(x).view(batch, length, 4, 4).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, length, 16)
        return self.head(out.mean(1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


class CrossAttention(Base):
    """nn.MultiheadAttention over a memory (key is value): the packed key/value projection."""

    lr = 0.01

    def __init__(self) -> None:
        super().__init__()
        self.memory = nn.Linear(16, 16)
        self.attention = nn.MultiheadAttention(16, 4, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        memory = self.memory(x.flip(1))
        out, _ = self.attention(x, memory, memory, need_weights=False)
        return self.head(out.mean(1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


class BiasKVAttention(Base):
    """Time-first self-attention with ``bias_k``/``bias_v``: torch's own packed in-projection
    (mha_export.py leaves it to torch), taken apart at the first dimension of its only tensor."""

    lr = 0.01

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(16, 4, add_bias_kv=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.transpose(0, 1)
        out, _ = self.attention(t, t, t, need_weights=False)
        return self.head(out.mean(0))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


def sequences() -> DataLoader:
    """Batches of varying size and length."""
    return sequence_batches([(4, 8), (2, 5), (4, 8), (3, 1), (4, 12), (1, 6)], 16)


def training_operators(directory: Path) -> list[str]:
    model = onnx.load(str(directory / "forward.training.4_optimized.onnx"))
    return [engine.aten_operator(node) or node.op_type for node in model.graph.node]


@pytest.mark.parametrize(
    ("make_model", "unbind"),
    [
        (lambda: PackedHeads("qkv"), "lightning_ort::unbind3"),
        (lambda: PackedHeads("negative-index"), "lightning_ort::unbind3"),
        (lambda: PackedHeads("detached-key"), "lightning_ort::unbind3"),
        (lambda: PackedHeads("kv"), "lightning_ort::unbind2"),
        (lambda: PackedHeads("partial"), None),
        (CrossAttention, "lightning_ort::unbind2"),
    ],
    ids=["qkv", "negative-index", "detached-key", "kv", "partial", "cross-attention"],
)
def test_packed_projection_is_taken_apart_in_one_node(make_model: Any, unbind: str | None, tmp_path: Path) -> None:
    dump = ONNXGraphDump(dirpath=tmp_path, stages=["optimized"])
    eager, ort = fit_both(make_model, sequences, 6, callbacks=[dump])
    assert_ort_ran(ort, 6)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    operators = training_operators(tmp_path)
    if unbind is None:
        assert not any(operator.startswith("lightning_ort::unbind") for operator in operators)
    else:
        assert operators.count(unbind) == 1 and operators.count(f"{unbind}_backward") == 1, operators
        assert "Split" not in operators and "Concat" not in operators, operators


class SelfAttention(CrossAttention):
    """nn.MultiheadAttention's self-attention: the packed q/k/v projection."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.attention(x, x, x, need_weights=False)
        return self.head(out.mean(1))


@pytest.mark.parametrize(
    "make_model",
    [lambda: PackedHeads("qkv"), CrossAttention, SelfAttention],
    ids=["qkv", "cross-attention", "self-attention"],
)
def test_a_batch_of_one_position_trains_like_eager(make_model: Any) -> None:
    """With one sequence of length 1 every part of the packed projection is contiguous in the input's
    memory, and torch's contiguous() gave the node's outputs as views of it, which ORT then reused
    (losses 1.18 vs 1.47, NaN weights after a TransformerEncoder's step)."""
    batches = sequence_batches([(4, 8), (1, 1), (3, 5), (1, 1)], 16)
    eager, ort = fit_both(make_model, lambda: batches, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_torchs_packed_in_projection_is_taken_apart_in_one_node(tmp_path: Path) -> None:
    # known to fuse_unbinds only through the annotations, which need the Mod of torch's unflatten
    dump = ONNXGraphDump(dirpath=tmp_path, stages=["optimized"])
    eager, ort = fit_both(BiasKVAttention, sequences, 6, callbacks=[dump])
    assert_ort_ran(ort, 6)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    operators = training_operators(tmp_path)
    assert operators.count("lightning_ort::unbind3") == 1 and "Split" not in operators, operators


@pytest.mark.parametrize(
    ("shape", "perm", "dim"),
    [((3, 5, 4, 8), (0, 1, 2, 3), 0), ((1, 1, 3, 4, 4), (2, 0, 3, 1, 4), 0), ((2, 5, 4, 8), (0, 1, 2, 3), 0)],
    ids=["packed-first", "one-position-permuted", "two-parts"],
)
def test_parts_are_copies_of_the_input(shape: tuple[int, ...], perm: tuple[int, ...], dim: int) -> None:
    """Each part is contiguous in the input's memory here: torch's own packed in-projection
    (``bias_k``) at any size, the permuted one for one position. A view of it given to ORT was
    overwritten when ORT reused the input's memory (``bias_k`` attention's loss wrong from step 0)."""
    load_aten_ops()
    x = torch.randn(shape)
    operator = torch.ops.lightning_ort.unbind3 if shape[perm[dim]] == 3 else torch.ops.lightning_ort.unbind2
    parts = operator(x, list(perm), dim)
    for part, expected in zip(parts, x.permute(perm).unbind(dim), strict=True):
        assert torch.equal(part, expected) and part.is_contiguous()
        assert part.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


class MixtureOfExperts(Base):
    """Mixtral-style top-2 routing: each expert takes the tokens ``torch.where(idx == e)`` finds. The
    (token, slot) pairs are the two halves of ``nonzero``'s last dimension, split by the packed-split
    rewrite; when an expert got no token, its reshape could not infer the part's size of an empty tensor
    and the module fell back to PyTorch for good."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(4, 4)
        self.experts = nn.ModuleList(nn.Linear(4, 4) for _ in range(4))
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits, chosen = self.router(x).topk(2, dim=-1)
        weights, out = logits.softmax(-1), torch.zeros_like(x)
        for number, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == number)
            out = out.index_add(0, token, expert(x[token]) * weights[token, slot, None])
        return self.head(x + out)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


def test_experts_without_tokens_train_in_ort_like_eager() -> None:
    generator = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(n, 4, generator=generator), torch.randint(0, 3, (n,), generator=generator)) for n in (32, 1)
    ]
    eager, ort = fit_both(MixtureOfExperts, lambda: DataLoader(batches * 2, batch_size=None), 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
