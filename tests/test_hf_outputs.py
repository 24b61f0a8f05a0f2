"""Hugging Face outputs and caches through ORT: ``ModelOutput`` dataclasses, ``DynamicCache`` objects given to the
blocks (causal LMs keep ``use_cache=True`` by default) and returned from forward, and the usual inputs."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
import transformers
from helpers import RunResult, assert_losses_match, assert_ort_ran, fit_both
from hf_models import CASES, VOCAB, HFModule, _bert, hf_loader

import lightning_ort


def _cache_tensors(cache: Any) -> list[torch.Tensor]:
    return [tensor for layer in cache.layers for tensor in (layer.keys, layer.values)]


def _assert_caches_match(eager: RunResult, ort: RunResult) -> None:
    assert len(eager.model.caches) == len(ort.model.caches) >= 1
    for expected, actual in zip(eager.model.caches, ort.model.caches, strict=True):
        assert type(actual) is type(expected)
        assert [type(layer) for layer in actual.layers] == [type(layer) for layer in expected.layers]
        assert actual.get_seq_length() == expected.get_seq_length() > 0
        for want, got in zip(_cache_tensors(expected), _cache_tensors(actual), strict=True):
            torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["llama", "mistral", "gpt2"])
def test_blocks_given_the_models_cache(name: str) -> None:
    """With ``use_cache`` left at its default, the model passes its DynamicCache to every block, which appends its
    keys and values: the blocks run in ORT and the cache the model returns holds eager's tensors."""
    case = CASES[name]
    strategy = lightning_ort.ORTStrategy(modules=[f"net.{blocks}" for blocks in case.blocks], fallback="raise")
    eager, ort = fit_both(
        lambda: HFModule(case.build(), case.task), lambda: hf_loader(case.task), max_steps=3, strategy=strategy
    )
    assert_ort_ran(ort, min_calls=3 * 2 * len(case.blocks))
    assert_losses_match(eager, ort)
    _assert_caches_match(eager, ort)


class LlamaWithoutMasks(L.LightningModule):
    """A Llama causal LM whose forward is Llama's own without the mask builder (sdpa then masks causally): one ORT
    graph that creates a DynamicCache and returns it in a ``CausalLMOutputWithPast``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = CASES["llama"].build()
        self.caches: list[Any] = []

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> Any:
        model = self.net.model
        cache = transformers.DynamicCache(config=self.net.config)
        hidden = model.embed_tokens(input_ids)
        positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
        rotary = model.rotary_emb(hidden, position_ids=positions)
        for layer in model.layers:
            hidden = layer(hidden, position_embeddings=rotary, position_ids=positions, past_key_values=cache)
        logits = self.net.lm_head(model.norm(hidden))
        loss = self.net.loss_function(logits=logits, labels=labels, vocab_size=VOCAB)
        return transformers.modeling_outputs.CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=cache)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        output = self(*batch)
        assert isinstance(output, transformers.modeling_outputs.CausalLMOutputWithPast)
        self.caches.append(output.past_key_values)
        return output.loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_forward_returning_a_dynamic_cache() -> None:
    """ORT's graph returns the cache's tensors; the caller gets a DynamicCache with eager's contents."""
    eager, ort = fit_both(LlamaWithoutMasks, lambda: hf_loader("lm"), max_steps=3)
    assert_ort_ran(ort, min_calls=3)
    assert [report.name for report in ort.reports] == ["forward"]
    assert_losses_match(eager, ort)
    _assert_caches_match(eager, ort)


class BertMaskedLM(L.LightningModule):
    """BERT's masked-LM head with labels of -100 (ignored) in the model, token type ids, position ids, and either
    token ids or ``inputs_embeds``; the whole forward is one ORT graph (no attention mask, so no mask builder)."""

    def __init__(self, embeds: bool) -> None:
        super().__init__()
        config = transformers.BertConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        )  # fmt: skip
        self.net = transformers.BertForMaskedLM(config)
        self.embeds = embeds

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> Any:
        token_types = (torch.arange(input_ids.shape[1]) >= input_ids.shape[1] // 2).long().expand_as(input_ids)
        positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
        inputs: dict[str, Any] = (
            {"inputs_embeds": self.net.bert.embeddings.word_embeddings(input_ids)}
            if self.embeds
            else {"input_ids": input_ids}
        )
        return self.net(**inputs, token_type_ids=token_types, position_ids=positions, labels=labels)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        input_ids, targets = batch
        labels = torch.where(targets % 3 == 0, input_ids, torch.full_like(input_ids, -100))
        output = self(input_ids, labels)
        assert isinstance(output, transformers.modeling_outputs.MaskedLMOutput)
        return output.loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("embeds", [False, True], ids=["input_ids", "inputs_embeds"])
def test_masked_lm_whole_forward(embeds: bool) -> None:
    eager, ort = fit_both(lambda: BertMaskedLM(embeds), lambda: hf_loader("lm"), max_steps=3)
    assert_ort_ran(ort, min_calls=3)
    assert_losses_match(eager, ort)


def test_cache_object_round_trip() -> None:
    """A cache given to ORT's forward and returned by it is the caller's own object, holding eager's state."""
    from lightning_ort import cache_io
    from lightning_ort.dataclass_io import from_mappings, to_mappings

    cache = transformers.DynamicCache(config=CASES["llama"].build().config)
    keys, values = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    given: list[Any] = []
    inner = from_mappings(to_mappings((cache,)), given)[0]  # what forward sees inside ORT
    assert inner is not cache and type(inner) is type(cache)
    inner.update(keys, values, 1)
    output = from_mappings(to_mappings({"cache": inner}, given), inputs=((cache,), {}))
    assert output["cache"] is cache
    assert torch.equal(cache.layers[1].keys, keys) and cache.get_seq_length(1) == 3 and cache.get_seq_length(0) == 0
    assert isinstance(to_mappings(cache), cache_io.CacheFields)


class HiddenStatesModule(L.LightningModule):
    """A classifier on a BERT's second-to-last hidden state (``output_hidden_states=True``), the BERT named in
    ``ORTStrategy(modules=[...])``. transformers records hidden states for the class it finds at
    ``model.__class__``; the module ORT exported in front of the BERT reported its own class, so the BERT's graph
    recorded no hidden states and the step failed."""

    def __init__(self) -> None:
        super().__init__()
        self.bert = transformers.BertModel(transformers.BertConfig(**_bert()))
        self.head = torch.nn.Linear(self.bert.config.hidden_size, VOCAB)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        ids, labels = batch
        hidden = self.bert(ids, output_hidden_states=True).hidden_states[-2]
        return torch.nn.functional.cross_entropy(self.head(hidden).flatten(0, 1), labels.flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_named_transformers_model_returns_the_hidden_states_asked_for() -> None:
    strategy = lightning_ort.ORTStrategy(mode="ort", modules=["bert"])
    eager, ort = fit_both(HiddenStatesModule, lambda: hf_loader("lm"), max_steps=3, strategy=strategy)
    reports = {report.name: report for report in ort.reports}
    # transformers installs its output-capturing hooks on the first such call: the BERT breaks into its modules
    assert "_output_capturing_hooks_installed" in (reports["bert"].fallback_reason or "")
    assert reports["bert"].submodules and sum(report.ort_calls for report in ort.reports) >= 3
    assert_losses_match(eager, ort)
