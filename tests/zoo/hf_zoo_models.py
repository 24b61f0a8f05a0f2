"""The zoo's Hugging Face transformers rows: tiny models built from configs (random weights, no download).

Each row keeps the user's defaults (``attn_implementation="sdpa"``, ``use_cache`` as the config sets it,
the loss computed inside the model from ``labels``) and turns dropout off so that eager and ORT do the
same arithmetic. Sizes: 2 layers, width 32, sequences of 16 tokens, batches of 4.

``Expect`` in each row is the outcome on this branch today; the table is the one place to tighten
when lightning_ort runs more of a model in ORT (a row that does better than it expects fails, saying so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
import transformers
from torch import Tensor, nn
from zoo_harness import Expect, ZooModel

VOCAB = 96
SEQ = 16
BATCH = 4
WIDTH = 32
LAYERS = 2
HEADS = 2
IMAGE = 32
CLASSES = 3


def hf_loss(module: L.LightningModule, batch: dict[str, Tensor]) -> Tensor:
    """The loss the model computes from ``labels`` (what an HF user's training_step returns)."""
    return module(**batch).loss


def _attention_mask(generator: torch.Generator) -> Tensor:
    """All ones but the last tokens of the second sequence (padding, as a tokenizer pads a batch)."""
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, SEQ - 5 :] = 0
    return mask


def causal_lm_batch(generator: torch.Generator) -> dict[str, Tensor]:
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=generator)
    mask = _attention_mask(generator)
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def masked_lm_batch(generator: torch.Generator) -> dict[str, Tensor]:
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=generator)
    chosen = torch.rand(BATCH, SEQ, generator=generator) < 0.25
    chosen[:, 0] = True  # every sequence predicts at least one token
    return {
        "input_ids": ids.masked_fill(chosen, 2),  # 2: the [MASK] id of these configs
        "attention_mask": _attention_mask(generator),
        "labels": ids.masked_fill(~chosen, -100),
    }


def classification_batch(generator: torch.Generator) -> dict[str, Tensor]:
    return {
        "input_ids": torch.randint(3, VOCAB, (BATCH, SEQ), generator=generator),
        "attention_mask": _attention_mask(generator),
        "labels": torch.randint(0, CLASSES, (BATCH,), generator=generator),
    }


def seq2seq_batch(generator: torch.Generator) -> dict[str, Tensor]:
    """Source and target; the model builds ``decoder_input_ids`` from ``labels``."""
    return {
        "input_ids": torch.randint(3, VOCAB, (BATCH, SEQ), generator=generator),
        "attention_mask": _attention_mask(generator),
        "labels": torch.randint(3, VOCAB, (BATCH, SEQ // 2), generator=generator),
    }


def image_batch(generator: torch.Generator) -> dict[str, Tensor]:
    return {
        "pixel_values": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=generator),
        "labels": torch.randint(0, CLASSES, (BATCH,), generator=generator),
    }


def _model(class_name: str, config_name: str, **config: Any) -> nn.Module:
    return getattr(transformers, class_name)(getattr(transformers, config_name)(**config))


def _bert(**extra: Any) -> dict[str, Any]:
    """BERT-family sizes with dropout off."""
    return dict(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=2 * WIDTH,
        max_position_embeddings=SEQ + 4,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=CLASSES,
        **extra,
    )


def _decoder(**extra: Any) -> dict[str, Any]:
    """Llama-family sizes (grouped-query attention: 4 query heads, 2 key/value heads)."""
    return dict(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2 * SEQ,
        **extra,
    )


def gpt2() -> nn.Module:
    return _model(
        "GPT2LMHeadModel",
        "GPT2Config",
        vocab_size=VOCAB,
        n_positions=2 * SEQ,
        n_embd=WIDTH,
        n_layer=LAYERS,
        n_head=HEADS,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )


def bert_classifier() -> nn.Module:
    return _model("BertForSequenceClassification", "BertConfig", **_bert())


def bert_mlm() -> nn.Module:
    return _model("BertForMaskedLM", "BertConfig", **_bert())


def distilbert() -> nn.Module:
    return _model(
        "DistilBertForSequenceClassification",
        "DistilBertConfig",
        vocab_size=VOCAB,
        dim=WIDTH,
        n_layers=LAYERS,
        n_heads=HEADS,
        hidden_dim=2 * WIDTH,
        max_position_embeddings=SEQ,
        dropout=0.0,
        attention_dropout=0.0,
        seq_classif_dropout=0.0,
        num_labels=CLASSES,
    )


def roberta_mlm() -> nn.Module:
    return _model("RobertaForMaskedLM", "RobertaConfig", **_bert(pad_token_id=1))


def electra() -> nn.Module:
    return _model("ElectraForSequenceClassification", "ElectraConfig", **_bert(embedding_size=WIDTH))


def albert() -> nn.Module:
    return _model("AlbertForMaskedLM", "AlbertConfig", **_bert(embedding_size=16, classifier_dropout_prob=0.0))


def llama() -> nn.Module:
    return _model("LlamaForCausalLM", "LlamaConfig", **_decoder())


def mistral() -> nn.Module:
    return _model("MistralForCausalLM", "MistralConfig", **_decoder())


def qwen2() -> nn.Module:
    return _model("Qwen2ForCausalLM", "Qwen2Config", **_decoder())


def gemma() -> nn.Module:
    return _model("GemmaForCausalLM", "GemmaConfig", **_decoder(head_dim=8))


def phi() -> nn.Module:
    return _model(
        "PhiForCausalLM",
        "PhiConfig",
        **{**_decoder(resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0), "num_key_value_heads": 4},
    )


def gpt_neox() -> nn.Module:
    return _model(
        "GPTNeoXForCausalLM",
        "GPTNeoXConfig",
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=2 * WIDTH,
        max_position_embeddings=2 * SEQ,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )


def opt() -> nn.Module:
    return _model(
        "OPTForCausalLM",
        "OPTConfig",
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        ffn_dim=2 * WIDTH,
        word_embed_proj_dim=WIDTH,
        max_position_embeddings=2 * SEQ,
        dropout=0.0,
        attention_dropout=0.0,
    )


def t5() -> nn.Module:
    return _model(
        "T5ForConditionalGeneration",
        "T5Config",
        vocab_size=VOCAB,
        d_model=WIDTH,
        d_kv=WIDTH // HEADS,
        d_ff=2 * WIDTH,
        num_layers=LAYERS,
        num_decoder_layers=LAYERS,
        num_heads=HEADS,
        dropout_rate=0.0,
        pad_token_id=0,
        decoder_start_token_id=0,
    )


def bart() -> nn.Module:
    return _model(
        "BartForConditionalGeneration",
        "BartConfig",
        vocab_size=VOCAB,
        d_model=WIDTH,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=2 * WIDTH,
        decoder_ffn_dim=2 * WIDTH,
        max_position_embeddings=2 * SEQ,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )


def vit() -> nn.Module:
    return _model(
        "ViTForImageClassification",
        "ViTConfig",
        image_size=IMAGE,
        patch_size=8,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=2 * WIDTH,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=CLASSES,
    )


def swin() -> nn.Module:
    return _model(
        "SwinForImageClassification",
        "SwinConfig",
        image_size=IMAGE,
        patch_size=2,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[2, 2],
        window_size=4,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        drop_path_rate=0.0,
        num_labels=CLASSES,
    )


def _eager_attention(build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """``build`` with transformers' eager attention and ``use_cache=False``."""

    def built() -> nn.Module:
        model = build()
        model.set_attn_implementation("eager")
        model.config.use_cache = False
        return model

    built.__name__ = f"{build.__name__}_eager_attention"
    return built


def _row(
    name: str, build: Callable[[], nn.Module], batch: Callable[[torch.Generator], Any], expect: Expect
) -> ZooModel:
    return ZooModel(f"transformers/{name}", build, batch, hf_loss, expect)


def _blocks(
    name: str, build: Callable[[], nn.Module], batch: Callable[[torch.Generator], Any], expect: Expect, *modules: str
) -> ZooModel:
    note = "eager attention, use_cache=False, the blocks named in ORTStrategy(modules=[...])"
    return ZooModel(
        f"transformers/{name} blocks",
        _eager_attention(build),
        batch,
        hf_loss,
        expect,
        {"modules": list(modules)},
        note=note,
    )


# The outcome of each row: tighten a row when lightning_ort runs more of its model. Every row but Mistral runs
# its whole forward as one ORT graph; Mistral's forward trains through graph breaks (ORT's gradient builder
# refuses its graph, whose outputs include a constant: the sliding-window cache's window tensor).
HF_MODELS: list[ZooModel] = [
    _row("gpt2", gpt2, causal_lm_batch, Expect("all")),
    _row("bert-classifier", bert_classifier, classification_batch, Expect("all")),
    _row("bert-mlm", bert_mlm, masked_lm_batch, Expect("all")),
    _row("distilbert", distilbert, classification_batch, Expect("all")),
    _row("roberta-mlm", roberta_mlm, masked_lm_batch, Expect("all")),
    _row("electra", electra, classification_batch, Expect("all")),
    _row("albert-mlm", albert, masked_lm_batch, Expect("all")),
    _row("llama", llama, causal_lm_batch, Expect("all")),
    _row("mistral", mistral, causal_lm_batch, Expect("all", graph_breaks=True)),
    _row("qwen2", qwen2, causal_lm_batch, Expect("all")),
    _row("gemma", gemma, causal_lm_batch, Expect("all")),
    _row("phi", phi, causal_lm_batch, Expect("all")),
    _row("gpt-neox", gpt_neox, causal_lm_batch, Expect("all")),
    _row("opt", opt, causal_lm_batch, Expect("all")),
    _row("t5", t5, seq2seq_batch, Expect("all")),
    _row("bart", bart, seq2seq_batch, Expect("all")),
    _row("vit", vit, image_batch, Expect("all")),
    _row("swin", swin, image_batch, Expect("all")),
]

# The blocks named in ORTStrategy(modules=[...]), with transformers' eager attention and no cache.
BLOCKS: list[ZooModel] = [
    _blocks("gpt2", gpt2, causal_lm_batch, Expect("partly", 0.85), "network.transformer.h"),
    _blocks("bert", bert_classifier, classification_batch, Expect("partly", 0.77), "network.bert.encoder.layer"),
    _blocks("llama", llama, causal_lm_batch, Expect("partly", 0.75), "network.model.layers"),
]
