"""Tiny Hugging Face transformers models built from configs (random weights, nothing downloaded), in a
LightningModule that trains them with the loss the model computes from ``labels``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
import transformers
from torch.utils.data import DataLoader, TensorDataset

VOCAB = 64
_SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
_NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@dataclass(frozen=True)
class HFCase:
    """How to build one model, which of its submodules are its blocks, and what its batches hold."""

    build: Callable[[str], torch.nn.Module]
    blocks: tuple[str, ...]
    task: str  # "lm" (causal LM), "cls" (sequence classification), "s2s" (encoder-decoder), "img"


def _config(name: str, attn: str, **kwargs: Any) -> Any:
    return getattr(transformers, name)(attn_implementation=attn, **kwargs)


CASES: dict[str, HFCase] = {
    "gpt2": HFCase(
        lambda attn: transformers.GPT2LMHeadModel(
            _config(
                "GPT2Config",
                attn,
                vocab_size=VOCAB,
                n_positions=32,
                n_embd=32,
                n_layer=2,
                n_head=4,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
            )
        ),
        ("transformer.h",),
        "lm",
    ),
    "bert": HFCase(
        lambda attn: transformers.BertForSequenceClassification(
            _config(
                "BertConfig", attn, vocab_size=VOCAB, max_position_embeddings=32, num_labels=3, **_SMALL, **_NO_DROPOUT
            )
        ),
        ("bert.encoder.layer",),
        "cls",
    ),
    "roberta": HFCase(
        lambda attn: transformers.RobertaForSequenceClassification(
            _config(
                "RobertaConfig",
                attn,
                vocab_size=VOCAB,
                max_position_embeddings=40,
                num_labels=3,
                **_SMALL,
                **_NO_DROPOUT,
            )
        ),
        ("roberta.encoder.layer",),
        "cls",
    ),
    "distilbert": HFCase(
        lambda attn: transformers.DistilBertForSequenceClassification(
            _config(
                "DistilBertConfig",
                attn,
                vocab_size=VOCAB,
                dim=32,
                n_layers=2,
                n_heads=4,
                hidden_dim=64,
                max_position_embeddings=32,
                dropout=0.0,
                attention_dropout=0.0,
                seq_classif_dropout=0.0,
                num_labels=3,
            )
        ),
        ("distilbert.transformer.layer",),
        "cls",
    ),
    "llama": HFCase(
        lambda attn: transformers.LlamaForCausalLM(
            _config("LlamaConfig", attn, vocab_size=VOCAB, num_key_value_heads=2, max_position_embeddings=32, **_SMALL)
        ),
        ("model.layers",),
        "lm",
    ),
    "mistral": HFCase(
        lambda attn: transformers.MistralForCausalLM(
            _config(
                "MistralConfig", attn, vocab_size=VOCAB, num_key_value_heads=2, max_position_embeddings=32, **_SMALL
            )
        ),
        ("model.layers",),
        "lm",
    ),
    "qwen2": HFCase(
        lambda attn: transformers.Qwen2ForCausalLM(
            _config("Qwen2Config", attn, vocab_size=VOCAB, num_key_value_heads=2, max_position_embeddings=32, **_SMALL)
        ),
        ("model.layers",),
        "lm",
    ),
    "gpt_neox": HFCase(
        lambda attn: transformers.GPTNeoXForCausalLM(
            _config(
                "GPTNeoXConfig",
                attn,
                vocab_size=VOCAB,
                max_position_embeddings=32,
                hidden_dropout=0.0,
                attention_dropout=0.0,
                **_SMALL,
            )
        ),
        ("gpt_neox.layers",),
        "lm",
    ),
    "opt": HFCase(
        lambda attn: transformers.OPTForCausalLM(
            _config(
                "OPTConfig",
                attn,
                vocab_size=VOCAB,
                hidden_size=32,
                ffn_dim=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                max_position_embeddings=32,
                word_embed_proj_dim=32,
                dropout=0.0,
                attention_dropout=0.0,
            )
        ),
        ("model.decoder.layers",),
        "lm",
    ),
    "t5": HFCase(
        lambda attn: transformers.T5ForConditionalGeneration(
            _config(
                "T5Config",
                attn,
                vocab_size=VOCAB,
                d_model=32,
                d_kv=8,
                d_ff=64,
                num_layers=2,
                num_heads=4,
                dropout_rate=0.0,
                decoder_start_token_id=0,
            )
        ),
        ("encoder.block", "decoder.block"),
        "s2s",
    ),
    "bart": HFCase(
        lambda attn: transformers.BartForConditionalGeneration(
            _config(
                "BartConfig",
                attn,
                vocab_size=VOCAB,
                d_model=32,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
                max_position_embeddings=32,
                dropout=0.0,
                attention_dropout=0.0,
                activation_dropout=0.0,
            )
        ),
        ("model.encoder.layers", "model.decoder.layers"),
        "s2s",
    ),
    "vit": HFCase(
        lambda attn: transformers.ViTForImageClassification(
            _config("ViTConfig", attn, image_size=16, patch_size=4, num_labels=3, **_SMALL, **_NO_DROPOUT)
        ),
        ("vit.layers",),
        "img",
    ),
}


class HFModule(L.LightningModule):
    """Trains ``net`` on the loss it computes itself. ``padding``: the first sequence of each batch ends in three
    padding tokens (``attention_mask`` of ints); ``use_cache``: passed on when not None (causal LMs default to True)."""

    def __init__(self, net: torch.nn.Module, task: str, padding: bool = False, use_cache: bool | None = None) -> None:
        super().__init__()
        self.net, self.task, self.padding, self.use_cache = net, task, padding, use_cache
        self.caches: list[Any] = []  # what the net returned as past_key_values, per step

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        if self.task == "img":
            return self.net(pixel_values=x, labels=y)
        mask = torch.ones_like(x)
        if self.padding:
            mask[0, -3:] = 0
        kwargs: dict[str, Any] = {} if self.use_cache is None else {"use_cache": self.use_cache}
        if self.task == "cls":
            return self.net(input_ids=x, attention_mask=mask, labels=y[:, 0] % 3)
        return self.net(input_ids=x, attention_mask=mask, labels=y, **kwargs)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        output = self(*batch)
        cache = getattr(output, "past_key_values", None)
        if cache is not None:
            self.caches.append(cache)
        return output.loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def hf_loader(task: str, length: int = 12) -> DataLoader:
    generator = torch.Generator().manual_seed(1)
    if task == "img":
        x = torch.randn(12, 3, 16, 16, generator=generator)
        y = torch.randint(0, 3, (12,), generator=generator)
    else:
        x = torch.randint(0, VOCAB, (12, length), generator=generator)
        y = torch.randint(0, VOCAB, (12, length), generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=4)
