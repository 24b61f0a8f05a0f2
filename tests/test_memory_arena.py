"""The memory arena of the torch kernels inside ORT's graphs changes where memory comes from, nothing else.

Models here are large enough for their activations to reach the arena (blocks of 64 KiB and more).
"""

from __future__ import annotations

import copy
import dataclasses
import gc
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from helpers import RunResult, assert_losses_match, assert_ort_ran, assert_states_match, fit, fit_both
from models import CNN, MLP, Base, EncoderClassifier, dict_loader, mlp_loader
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning_ort
from lightning_ort import engine


def wide_cnn() -> CNN:
    """Convolutions with BatchNorm and pooling, then a wide head, on 16x16 images."""
    return CNN(channels=32, hidden=256, image_size=16)


def wide_image_loader() -> DataLoader:
    g = torch.Generator().manual_seed(4)
    images, labels = torch.randn(200, 3, 16, 16, generator=g), torch.randint(0, 4, (200,), generator=g)
    return DataLoader(TensorDataset(images, labels), batch_size=48)  # the last batch has 8


def wide_encoder() -> EncoderClassifier:
    return EncoderClassifier(d_model=256)


FAMILIES: list[tuple[Callable[[], Base], Callable[[], DataLoader]]] = [
    (wide_cnn, wide_image_loader),
    (wide_encoder, lambda: dict_loader(batch_size=40)),
]


def _fit_with_arena(make_model: Callable[[], Base], make_loader: Callable[[], DataLoader], arena: bool) -> RunResult:
    torch.manual_seed(0)
    before = engine.memory_arena_stats().reuses
    result = fit(make_model(), make_loader(), lightning_ort.ORTStrategy(memory_arena=arena), max_steps=8)
    assert_ort_ran(result, 8)
    reused = engine.memory_arena_stats().reuses - before
    assert (reused > 0) == arena, f"the arena served {reused} allocations with memory_arena={arena}"
    return result


@pytest.mark.parametrize(("make_model", "make_loader"), FAMILIES, ids=["cnn", "encoder"])
def test_training_is_bit_for_bit_the_same_with_and_without_the_arena(
    make_model: Callable[[], Base], make_loader: Callable[[], DataLoader]
) -> None:
    with_arena = _fit_with_arena(make_model, make_loader, arena=True)
    without = _fit_with_arena(make_model, make_loader, arena=False)
    assert with_arena.losses == without.losses
    assert with_arena.state.keys() == without.state.keys()
    for key, value in with_arena.state.items():
        assert torch.equal(value, without.state[key]), key


def test_training_with_the_arena_follows_eager() -> None:
    eager, ort = fit_both(wide_encoder, lambda: dict_loader(batch_size=40), 8)
    assert_ort_ran(ort, 8)
    assert_losses_match(eager, ort, rtol=1e-4)
    assert_states_match(eager, ort)


def test_teardown_gives_free_blocks_back_and_eager_code_never_uses_the_arena() -> None:
    result = _fit_with_arena(wide_cnn, wide_image_loader, arena=True)
    after_fit = engine.memory_arena_stats()
    assert after_fit.reserved_bytes == after_fit.in_use_bytes, "free blocks outlived the Trainer"
    del result
    gc.collect()  # gradients the model held go back to the arena now, not during the check below
    gc.disable()
    try:
        before = engine.memory_arena_stats()
        big = torch.empty(1 << 20)
        del big
        assert engine.memory_arena_stats() == before
    finally:
        gc.enable()


def test_varying_batch_sizes_keep_the_arena_bounded() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    twin = copy.deepcopy(model)
    defaults = lightning_ort.ORTStrategy().runtime_options
    with_arena = engine.wrap_module(model, defaults)
    without = engine.wrap_module(twin, dataclasses.replace(defaults, memory_arena=False))
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, twin)]
    engine.release_memory_arena()
    reuses = engine.memory_arena_stats().reuses
    sizes = torch.randint(8, 400, (24,), generator=torch.Generator().manual_seed(5)).tolist()
    for step, batch in enumerate(sizes):
        x, y = torch.randn(batch, 64), torch.randint(0, 10, (batch,))
        for call, optimizer in zip((with_arena, without), optimizers, strict=True):
            optimizer.zero_grad()
            F.cross_entropy(call(x), y).backward()
            optimizer.step()
        stats = engine.memory_arena_stats()
        assert stats.reserved_bytes <= 2 * stats.peak_in_use_bytes, f"step {step} (batch {batch}): {stats}"
    assert stats.reuses > reuses
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)


class BigLossTemporaries(MLP):
    """A small model (ORT's graph allocates less than the arena's 64 KiB) whose loss builds 1 MiB
    temporaries in eager PyTorch, outside the graph."""

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits = self(batch[0])
        spread = torch.ones(1 << 18) * logits.detach().mean()
        return F.cross_entropy(logits, batch[1]) + 0.0 * spread.sum()


@pytest.mark.parametrize("arena", [True, False], ids=["arena", "no-arena"])
def test_under_the_strategy_the_whole_step_uses_the_arena(arena: bool) -> None:
    before = engine.memory_arena_stats().reuses
    result = fit(BigLossTemporaries(), mlp_loader(), lightning_ort.ORTStrategy(memory_arena=arena), max_steps=6)
    assert_ort_ran(result, 6)
    reused = engine.memory_arena_stats().reuses - before
    assert (reused >= 5) == arena, f"the arena served {reused} allocations with memory_arena={arena}"
