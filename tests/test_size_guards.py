"""Python branches on sizes become guards: checked before every call, a new export when one flips.

Every Hugging Face model's mask helpers branch on sizes (``if kv_length + kv_offset -
mask.shape[-1] > 0``); those decisions used to send the whole model to PyTorch. Now each is kept with
the graph as an expression over the inputs' sizes (``engine/export/guards/size_guards.py``), and a call whose sizes
answer one otherwise gets a new export (``ORTModuleReport.size_exports``), never the old graph.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
import transformers
from helpers import assert_losses_match, assert_ort_ran, fit_both
from torch.utils.data import DataLoader

from lightning_ort import ORTStrategy
from lightning_ort.engine.export import export_cache

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


class _FollowedSizes(_Branching):
    """Branches on sizes the guards follow through an in-place write (``_shift_right`` of T5 and BART), a
    convolution (Swin's patch embedding), a concatenation with an empty vector (a cache's first update) and
    ``F.pad`` (Swin's windows: torchvision pads a feature map to a multiple of the window, then shifts the windows
    only where more than one window covers it)."""

    def __init__(self, through: str) -> None:
        super().__init__()
        self.through = through
        self.conv = torch.nn.Conv1d(8, 8, kernel_size=3, stride=2, padding=1)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        if self.through == "in-place":
            shifted = ids.new_zeros(ids.shape)
            shifted[:, 1:] = ids[:, :-1]
            shifted.masked_fill_(shifted == 3, 0)
            longer = shifted.shape[1] > 8
        elif self.through == "convolution":
            longer = self.conv(h.transpose(1, 2)).shape[-1] > 4  # ceil(length / 2)
        elif self.through == "padding":
            padded = torch.nn.functional.pad(h, (0, 0, 0, (4 - h.shape[1] % 4) % 4))  # 6 -> 8, 12 -> 12
            _, length, _ = padded.shape
            longer = length > 8
        else:
            cached = torch.cat([torch.tensor([]), h], dim=-2)
            longer = cached.shape[-2] > 8
        if longer:
            h = torch.tanh(h) * 2
        return self.head(h)


@pytest.mark.parametrize("through", ["in-place", "convolution", "concatenation", "padding"])
def test_a_branch_on_sizes_followed_through_more_operators_is_a_guard(through: str) -> None:
    eager, ort = fit_both(
        lambda: _FollowedSizes(through),
        lambda: _batches((6, 12), steps=4),
        max_steps=4,
        strategy=ORTStrategy(fullgraph=True),
    )
    (report,) = ort.reports
    assert report.fallback_reason is None, report.fallback_reason
    assert_ort_ran(ort, min_calls=4)
    assert_losses_match(eager, ort)
    assert report.size_exports == 3  # one per flip: 6, 12, 6, 12


class _BranchOnMask(_Branching):
    """A branch on the values of an input (``mask.all()``, or the sum against the count of ``fast_all``)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        full = mask.bool().all() if self.how == "all" else mask.sum() == mask.numel()
        if full:
            h = torch.tanh(h) * 2
        else:
            h = h * mask.unsqueeze(-1)
        return self.head(h)


def _masked_batches(full: tuple[bool, ...]) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    data = []
    for step_full in full:
        ids = torch.randint(0, _VOCAB, (2, 6), generator=generator)
        mask = torch.ones(2, 6, dtype=torch.long)
        if not step_full:
            mask[1, 4:] = 0
        data.append((ids, mask))
    return DataLoader(data, batch_size=None)


@pytest.mark.parametrize("how", ["all", "sum"])
def test_a_branch_on_input_values_is_a_guard_that_exports_again_when_it_flips(how: str) -> None:
    """All-ones masks, then padded, then all-ones: each flip a new export, losses equal eager's at every step."""
    full = (True, True, False, False, True, False)
    eager, ort = fit_both(
        lambda: _BranchOnMask(how),
        lambda: _masked_batches(full),
        max_steps=len(full),
        strategy=ORTStrategy(fullgraph=True),
    )
    (report,) = ort.reports
    assert report.fallback_reason is None, report.fallback_reason
    assert_ort_ran(ort, min_calls=len(full))
    assert report.torch_calls == 0
    assert_losses_match(eager, ort)
    assert report.size_exports == 3  # one per flip


class _BranchOnWeights(_Branching):
    """A branch on a value computed from a parameter, or from the data through a parameter (as a number, or as a
    one-element tensor that is not 0-d): not a guard."""

    def __init__(self, through: str) -> None:
        super().__init__()
        self.through = through

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        if self.through == "parameter":
            value = self.head.weight.sum()
        else:
            value = h.sum() if self.through == "data" else h.sum(dim=(0, 1, 2), keepdim=True)
        if value > 0:
            h = h * 2
        return self.head(h)


@pytest.mark.parametrize("through", ["parameter", "data", "one-element data"])
def test_a_branch_on_values_that_are_not_the_inputs_alone_still_falls_back(through: str) -> None:
    _, ort = fit_both(
        lambda: _BranchOnWeights(through),
        lambda: _masked_batches((True, True)),
        max_steps=2,
        strategy=ORTStrategy(fullgraph=True),
    )
    (report,) = ort.reports
    assert report.fallback_reason is not None
    assert "depend on tensor data" in report.fallback_reason, report.fallback_reason
    assert f"{Path(__file__).name}:" in report.fallback_reason, report.fallback_reason  # the branch's own line


@pytest.mark.parametrize("on", ["values", "sizes"])
def test_a_guard_is_kept_with_a_cached_export_and_picks_the_cached_graph_that_fits(
    on: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With export_cache=True, the export after a flip must not reuse the cached graph of the other branch (the
    cache's key holds no sizes or values: it used to, and trained the padded batch on the all-ones graph), and a
    second run reusing the cached graphs still checks the branch."""
    monkeypatch.setattr(export_cache, "cache_root", lambda: tmp_path)
    if on == "values":
        make, loader = (lambda: _BranchOnMask("sum")), (lambda: _masked_batches((True, False, True)))
    else:
        make, loader = _Branching, (lambda: _batches((6, 12), steps=3))
    for _ in range(2):
        eager, ort = fit_both(make, loader, max_steps=3, strategy=ORTStrategy(fullgraph=True, export_cache=True))
        (report,) = ort.reports
        assert report.fallback_reason is None and report.torch_calls == 0, report
        assert_losses_match(eager, ort)
        assert report.size_exports == 2
    assert any(tmp_path.rglob("*.onnx")), "nothing was cached"
