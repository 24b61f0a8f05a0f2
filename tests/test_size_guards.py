"""Python branches on sizes become guards: checked before every call, a new export when one flips.

Every Hugging Face model's mask helpers branch on sizes (``if kv_length + kv_offset -
mask.shape[-1] > 0``); those decisions used to send the whole model to PyTorch. Now each is kept with
the graph as an expression over the inputs' sizes (``engine/export/size_guards.py``), and a call whose sizes
answer one otherwise gets a new export (``ORTModuleReport.size_exports``), never the old graph.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
import transformers
from helpers import assert_losses_match, assert_ort_ran, fit_both
from torch.utils.data import DataLoader

from lightning_ort import ORTStrategy

_VOCAB = 64


def _batches(lengths: tuple[int, ...], steps: int = 4, batch: int = 2) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    data = []
    for step in range(steps):
        length = lengths[step % len(lengths)]
        ids = torch.randint(0, _VOCAB, (batch, length), generator=generator)
        data.append((ids, torch.ones(batch, length, dtype=torch.long)))
    return DataLoader(data, batch_size=None)


class _LanguageModel(L.LightningModule):
    """A Hugging Face model built from a tiny config (random weights, no dropout), trained on its own ids."""

    def __init__(self, family: str) -> None:
        super().__init__()
        if family == "gpt2":
            config = transformers.GPT2Config(
                n_layer=2, n_embd=16, n_head=2, vocab_size=_VOCAB, n_positions=32,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            )  # fmt: skip
            self.model = transformers.GPT2LMHeadModel(config)
        else:
            config = transformers.BertConfig(
                num_hidden_layers=2, hidden_size=16, num_attention_heads=2, intermediate_size=32,
                vocab_size=_VOCAB, max_position_embeddings=32, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
            )  # fmt: skip
            self.model = transformers.BertForMaskedLM(config)
        self.family = family

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        extra = {"use_cache": False} if self.family == "gpt2" else {}
        return self.model(input_ids=ids, attention_mask=mask, **extra).logits

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        ids, mask = batch
        logits = self(ids, mask)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, _VOCAB), ids.reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_hugging_face_model_trains_in_ort_over_two_sequence_lengths(family: str) -> None:
    """The whole forward (mask helpers included) runs in ORT, at parity with eager at every step, with
    sequence lengths alternating: the mask helpers' decisions hold for both, so one graph serves them."""
    eager, ort = fit_both(lambda: _LanguageModel(family), lambda: _batches((6, 9)), max_steps=4)
    assert_ort_ran(ort, min_calls=4)
    assert_losses_match(eager, ort)
    (report,) = ort.reports
    assert report.size_exports == 0


class _Branching(L.LightningModule):
    """A branch on a size that flips between batches: longer sequences take another path."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(_VOCAB, 8)
        self.head = torch.nn.Linear(8, _VOCAB)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        if h.shape[1] - mask.shape[1] // 2 > 4:  # length > 8
            h = torch.tanh(h) * 2
        return self.head(h)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        ids, mask = batch
        return torch.nn.functional.cross_entropy(self(ids, mask).reshape(-1, _VOCAB), ids.reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5)


def test_a_branch_on_sizes_that_flips_exports_again_instead_of_reusing_the_graph() -> None:
    eager, ort = fit_both(_Branching, lambda: _batches((6, 12), steps=4), max_steps=4)
    assert_ort_ran(ort, min_calls=4)
    assert_losses_match(eager, ort)
    (report,) = ort.reports
    assert report.size_exports == 3  # one per flip: 6, 12, 6, 12


class _DataDependentSize(_Branching):
    """A branch on a size only the data decides (a boolean mask's selection): not a guard."""

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        if h[ids > 10].shape[0] > 3:
            h = h * 2
        return self.head(h)


def test_a_branch_on_sizes_the_data_decides_falls_back_quoting_the_line() -> None:
    _, ort = fit_both(
        _DataDependentSize, lambda: _batches((6,), steps=2), max_steps=2, strategy=ORTStrategy(fullgraph=True)
    )
    (report,) = ort.reports
    assert report.fallback_reason is not None
    assert "control flow on sizes at" in report.fallback_reason
    assert "(if h[ids > 10].shape[0] > 3:)" in report.fallback_reason, report.fallback_reason
