"""Hugging Face transformers' blocks with their default attention (``sdpa``) train in ORT at eager's losses.

transformers' ``sdpa_attention_forward`` decides ``is_causal`` and its grouped-query strategy from tensor
sizes, which the export refused; Llama, Mistral and Qwen2 pass ``enable_gqa=True``, which torch's
exporter refused (``engine/export/hf_attention.py``, ``engine/ops/symbolics/attention.py``).
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, fit_both
from hf_models import CASES, VOCAB, HFModule, hf_loader
from torch.utils.data import DataLoader, TensorDataset

import lightning_ort


def _fit_blocks(name: str, steps: int = 3, padding: bool = False, use_cache: bool | None = False) -> tuple:
    case = CASES[name]
    strategy = lightning_ort.ORTStrategy(modules=[f"net.{blocks}" for blocks in case.blocks], fallback="raise")
    return fit_both(
        lambda: HFModule(case.build(), case.task, padding, use_cache),
        lambda: hf_loader(case.task),
        max_steps=steps,
        strategy=strategy,
    )


@pytest.mark.parametrize("name", sorted(name for name, case in CASES.items() if case.blocks))
def test_blocks_train_in_ort_with_sdpa(name: str) -> None:
    eager, ort = _fit_blocks(name)
    assert_ort_ran(ort, min_calls=3 * 2 * len(CASES[name].blocks))
    assert_losses_match(eager, ort)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "bart"])
def test_blocks_with_padding_masks(name: str) -> None:
    """An ``attention_mask`` with padding: the blocks get a boolean 4-D mask instead of ``is_causal``."""
    eager, ort = _fit_blocks(name, padding=True)
    assert_ort_ran(ort, min_calls=3 * 2 * len(CASES[name].blocks))
    assert_losses_match(eager, ort)


class LogitsLoss(HFModule):
    """A loss from the logits alone (the causal LM loss of one token has no targets)."""

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.net(input_ids=batch[0], use_cache=False).logits.pow(2).mean()


def test_causal_blocks_at_every_length() -> None:
    """The graph exported for one length is eager's at others, a single token included (where transformers turns
    ``is_causal`` off): with equal query and key lengths, SDPA's causal mask is eager's choice for every length."""
    generator = torch.Generator().manual_seed(0)
    batches = [
        (torch.randint(0, VOCAB, (2, length), generator=generator), torch.randint(0, VOCAB, (2, length)))
        for length in (6, 1, 4, 1, 9)
    ]

    def loader() -> DataLoader:
        return DataLoader(batches, batch_size=None)

    case = CASES["qwen2"]
    strategy = lightning_ort.ORTStrategy(modules=["net.model.layers"], fallback="raise")
    eager, ort = fit_both(
        lambda: LogitsLoss(case.build(), case.task, use_cache=False), loader, max_steps=5, strategy=strategy
    )
    assert_ort_ran(ort, min_calls=10)
    assert_losses_match(eager, ort)


class GroupedQueryAttention(L.LightningModule):
    """``F.scaled_dot_product_attention(..., enable_gqa=True)``: 4 query heads share 2 key/value heads."""

    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.query, self.key_value, self.out = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 1)
        self.causal = causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        query = self.query(x).view(batch, length, 4, 4).transpose(1, 2)
        key, value = self.key_value(x).view(batch, length, 2, 8).transpose(1, 2).chunk(2, dim=-1)
        mask = None if self.causal else torch.ones(length, length, dtype=torch.bool).tril()
        attended = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, is_causal=self.causal, enable_gqa=True
        )
        return self.out(attended.transpose(1, 2).reshape(batch, length, 16))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("op_rewrites", [None, False], ids=["torch_kernels", "onnx"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "mask"])
def test_grouped_query_attention(causal: bool, op_rewrites: bool | None) -> None:
    def loader() -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(12, 6, 16, generator=torch.Generator().manual_seed(0))), 4)

    strategy = lightning_ort.ORTStrategy(op_rewrites=op_rewrites, fallback="raise")
    eager, ort = fit_both(lambda: GroupedQueryAttention(causal), loader, max_steps=3, strategy=strategy)
    assert_ort_ran(ort, min_calls=3)
    assert_losses_match(eager, ort)
