"""The zoo's Hugging Face transformers rows: the tiny models of ``tests/hf_models.py`` (built from configs, random
weights, no download), with their batches and what each row expects.

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
from hf_models import BATCH, CASES, CLASSES, IMAGE, SEQ, VOCAB
from torch import Tensor, nn
from zoo_harness import Expect, ZooModel


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


def segmentation_batch(generator: torch.Generator) -> dict[str, Tensor]:
    """Images and a class per pixel."""
    return {
        "pixel_values": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=generator),
        "labels": torch.randint(0, CLASSES, (BATCH, IMAGE, IMAGE), generator=generator),
    }


def audio_seq2seq_batch(generator: torch.Generator) -> dict[str, Tensor]:
    """Log-mel features (16 bins, 32 frames: Whisper's convolutions halve them to its 16 positions) and a target."""
    return {
        "input_features": torch.randn(BATCH, 16, 32, generator=generator),
        "labels": torch.randint(3, VOCAB, (BATCH, SEQ // 2), generator=generator),
    }


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


# The outcome of each row: tighten a row when lightning_ort runs more of its model. Every row runs its whole
# forward as one ORT graph (Expect(..., graph_breaks=True) would say it trains through graph breaks).
HF_MODELS: list[ZooModel] = [
    _row("gpt2", CASES["gpt2"].build, causal_lm_batch, Expect("all")),
    _row("bert-classifier", CASES["bert"].build, classification_batch, Expect("all")),
    _row("bert-mlm", CASES["bert-mlm"].build, masked_lm_batch, Expect("all")),
    _row("distilbert", CASES["distilbert"].build, classification_batch, Expect("all")),
    _row("roberta-mlm", CASES["roberta-mlm"].build, masked_lm_batch, Expect("all")),
    _row("electra", CASES["electra"].build, classification_batch, Expect("all")),
    _row("albert-mlm", CASES["albert-mlm"].build, masked_lm_batch, Expect("all")),
    _row("llama", CASES["llama"].build, causal_lm_batch, Expect("all")),
    _row("mistral", CASES["mistral"].build, causal_lm_batch, Expect("all")),
    _row("qwen2", CASES["qwen2"].build, causal_lm_batch, Expect("all")),
    _row("gemma", CASES["gemma"].build, causal_lm_batch, Expect("all")),
    _row("phi", CASES["phi"].build, causal_lm_batch, Expect("all")),
    _row("gpt-neox", CASES["gpt_neox"].build, causal_lm_batch, Expect("all")),
    _row("opt", CASES["opt"].build, causal_lm_batch, Expect("all")),
    _row("t5", CASES["t5"].build, seq2seq_batch, Expect("all")),
    _row("bart", CASES["bart"].build, seq2seq_batch, Expect("all")),
    _row("vit", CASES["vit"].build, image_batch, Expect("all")),
    _row("swin", CASES["swin"].build, image_batch, Expect("all")),
    _row("deberta-v2-mlm", CASES["deberta-v2-mlm"].build, masked_lm_batch, Expect("all")),
    _row("bloom", CASES["bloom"].build, causal_lm_batch, Expect("all")),
    _row("falcon", CASES["falcon"].build, causal_lm_batch, Expect("all")),
    _row("qwen3", CASES["qwen3"].build, causal_lm_batch, Expect("all")),
    _row("gemma2", CASES["gemma2"].build, causal_lm_batch, Expect("all")),
    _row("mobilebert", CASES["mobilebert"].build, classification_batch, Expect("all")),
    _row("whisper", CASES["whisper"].build, audio_seq2seq_batch, Expect("all")),
    _row("beit", CASES["beit"].build, image_batch, Expect("all")),
    _row("dinov2", CASES["dinov2"].build, image_batch, Expect("all")),
    _row("convnext", CASES["convnext"].build, image_batch, Expect("all")),
    # the model installs its output-capturing hooks on its first call (an attribute a forward sets): ORT runs
    # the stages' modules, the glue between them runs in PyTorch
    _row("segformer", CASES["segformer"].build, segmentation_batch, Expect("all", graph_breaks=True)),
    # transformers' experts count tokens per expert with torch.histc, which torch's ONNX export has no symbolic for:
    # the decoder layers train in PyTorch, the embeddings and the head in ORT
    _row("mixtral", CASES["mixtral"].build, causal_lm_batch, Expect("partly", 0.2, reason="aten::histc")),
]

# The blocks named in ORTStrategy(modules=[...]), with transformers' eager attention and no cache.
BLOCKS: list[ZooModel] = [
    _blocks("gpt2", CASES["gpt2"].build, causal_lm_batch, Expect("partly", 0.85), "network.transformer.h"),
    _blocks("bert", CASES["bert"].build, classification_batch, Expect("partly", 0.77), "network.bert.encoder.layer"),
    _blocks("llama", CASES["llama"].build, causal_lm_batch, Expect("partly", 0.75), "network.model.layers"),
]
