"""A deep stack of residual blocks (timm's ViT pattern) exports in time linear in its depth.

The export's size checks (``fixed_sizes.py``) follow a traced size back through the graph; each
residual add (``x = x + block(x)``) has two operands that both lead back to the stream, so without a
memo the number of paths doubled per block: a 12-block ViT did not finish its first step in 300 s.
"""

from __future__ import annotations

import lightning as L
import torch
from helpers import assert_losses_match, assert_ort_ran, fit_both
from torch.utils.data import DataLoader, TensorDataset

from lightning_ort.engine.export import fixed_sizes

_BLOCKS = 12


class _Attention(torch.nn.Module):
    """timm's ``Attention``: sizes read from the stream, ``C // heads`` computed from them."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, dim * 3)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attention = (q @ k.transpose(-2, -1) * (C // self.heads) ** -0.5).softmax(dim=-1)
        return self.proj((attention @ v).transpose(1, 2).reshape(B, N, C))


class _Block(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.attention = _Attention(dim, heads=2)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, dim * 2), torch.nn.GELU(), torch.nn.Linear(dim * 2, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class _DeepResidual(L.LightningModule):
    def __init__(self, blocks: int = _BLOCKS, dim: int = 8) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(4, dim)
        self.blocks = torch.nn.Sequential(*(_Block(dim) for _ in range(blocks)))
        self.head = torch.nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x)).mean(1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 5, 4, generator=generator), torch.randn(8, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=4)


def test_deep_residual_stack_trains_in_ort_with_linear_size_checks(monkeypatch: object) -> None:
    """12 pre-norm blocks train in ORT like eager, and the size checks visit each (value, dimension) a
    bounded number of times: without the memo the count doubles per block (2**12 paths per query at the top here)."""
    calls, bound = 0, 1_000 * _BLOCKS
    original = fixed_sizes.fixed_size

    def counted(*args: object) -> bool:
        nonlocal calls
        calls += 1
        if calls > bound:  # stop the exponential recursion instead of waiting for it (the test fails below)
            raise RecursionError("fixed_size visited too often")
        return original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(fixed_sizes, "fixed_size", counted)  # type: ignore[attr-defined]
    eager, ort = fit_both(_DeepResidual, _loader, max_steps=2)
    assert_ort_ran(ort, min_calls=2)
    assert_losses_match(eager, ort)
    # a few queries per block, each linear in the trace: well under the bound; the unmemoised recursion is
    # stopped only by its depth limit (64) and makes millions of calls
    assert calls <= bound, calls
