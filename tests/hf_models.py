"""The tests' one table of tiny Hugging Face transformers models, built from configs (random weights, nothing
downloaded, dropout off): the zoo (``tests/zoo/hf_zoo_models.py``) trains them as a user would, the HF tests
(``test_hf_blocks.py``, ``test_hf_outputs.py``) their blocks and outputs through :class:`HFModule`.

Sizes: 2 layers, width 32, sequences of 16 tokens (the zoo's batches; :func:`hf_loader`'s are 12 long), batches
of 4, 32x32 images. Every model keeps transformers' default attention (``sdpa``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
import transformers
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

VOCAB = 96
SEQ = 16
BATCH = 4
WIDTH = 32
LAYERS = 2
HEADS = 2
IMAGE = 32
CLASSES = 3


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


def _vit_like(class_name: str, config_name: str, **extra: Any) -> nn.Module:
    """A ViT-shaped image classifier at the tables' sizes (patches of 8), with ``extra`` config fields."""
    return _model(
        class_name, config_name, image_size=IMAGE, patch_size=8, hidden_size=WIDTH, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=2 * WIDTH, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, num_labels=CLASSES, **extra,
    )  # fmt: skip


def vit() -> nn.Module:
    return _vit_like("ViTForImageClassification", "ViTConfig")


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


def deberta_v2_mlm() -> nn.Module:
    """Disentangled attention with relative positions (log buckets), p2c and c2p."""
    return _model(
        "DebertaV2ForMaskedLM",
        "DebertaV2Config",
        **_bert(relative_attention=True, position_buckets=8, pos_att_type=["p2c", "c2p"], max_relative_positions=SEQ),
    )


def bloom() -> nn.Module:
    """ALiBi position biases."""
    return _model(
        "BloomForCausalLM", "BloomConfig", vocab_size=VOCAB, hidden_size=WIDTH, n_layer=LAYERS, n_head=4,
        hidden_dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip


def falcon() -> nn.Module:
    return _model(
        "FalconForCausalLM", "FalconConfig", vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=LAYERS,
        num_attention_heads=4, hidden_dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip


def qwen3() -> nn.Module:
    """Query and key RMSNorm."""
    return _model("Qwen3ForCausalLM", "Qwen3Config", **_decoder(head_dim=8))


def gemma2() -> nn.Module:
    """Logit softcapping, alternating sliding-window and global attention."""
    return _model(
        "Gemma2ForCausalLM", "Gemma2Config", **_decoder(head_dim=8, sliding_window=8, query_pre_attn_scalar=8)
    )


def mixtral() -> nn.Module:
    """Mixture of experts: top-2 routing over 4 experts."""
    return _model("MixtralForCausalLM", "MixtralConfig", **_decoder(num_local_experts=4, num_experts_per_tok=2))


def mobilebert() -> nn.Module:
    """Bottleneck layers, NoNorm."""
    return _model(
        "MobileBertForSequenceClassification",
        "MobileBertConfig",
        **{**_bert(), "embedding_size": 16, "intra_bottleneck_size": 16, "true_hidden_size": 16},
    )


def whisper() -> nn.Module:
    """Audio encoder-decoder: convolutions over log-mel features (16 bins, 32 frames)."""
    return _model(
        "WhisperForConditionalGeneration", "WhisperConfig", vocab_size=VOCAB, num_mel_bins=16, d_model=WIDTH,
        encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
        encoder_ffn_dim=2 * WIDTH, decoder_ffn_dim=2 * WIDTH, max_source_positions=16, max_target_positions=2 * SEQ,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=0, suppress_tokens=None, begin_suppress_tokens=None,
    )  # fmt: skip


def beit() -> nn.Module:
    """Relative position bias in every layer, mean pooling."""
    return _vit_like(
        "BeitForImageClassification", "BeitConfig", use_relative_position_bias=True, use_mean_pooling=True,
        drop_path_rate=0.0,
    )  # fmt: skip


def dinov2() -> nn.Module:
    """Layer scale, interpolated position embeddings."""
    return _vit_like("Dinov2ForImageClassification", "Dinov2Config", mlp_ratio=2, drop_path_rate=0.0)


def convnext() -> nn.Module:
    return _model(
        "ConvNextForImageClassification", "ConvNextConfig", num_stages=2, num_channels=3, patch_size=4,
        hidden_sizes=[16, 32], depths=[1, 1], drop_path_rate=0.0, num_labels=CLASSES,
    )  # fmt: skip


def segformer() -> nn.Module:
    """Semantic segmentation: the decode head reads every stage's hidden state (transformers' output capturing)."""
    return _model(
        "SegformerForSemanticSegmentation", "SegformerConfig", num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
        hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0, drop_path_rate=0.0,
        decoder_hidden_size=32, num_labels=CLASSES, semantic_loss_ignore_index=255,
    )  # fmt: skip


def roberta_classifier() -> nn.Module:
    return _model("RobertaForSequenceClassification", "RobertaConfig", **_bert(pad_token_id=1))


@dataclass(frozen=True)
class HFCase:
    """How to build one model, which of its submodules are its blocks (none: not trained by blocks in the HF tests),
    and what :class:`HFModule`'s batches hold for it."""

    build: Callable[[], nn.Module]
    blocks: tuple[str, ...]
    task: str  # "lm" (causal LM), "cls" (sequence classification), "s2s" (encoder-decoder), "img", "mlm",
    # "audio-s2s" (log-mel features to text), "seg" (a class per pixel): the zoo's batches only


CASES: dict[str, HFCase] = {
    "gpt2": HFCase(gpt2, ("transformer.h",), "lm"),
    "bert": HFCase(bert_classifier, ("bert.encoder.layer",), "cls"),
    "bert-mlm": HFCase(bert_mlm, (), "mlm"),
    "distilbert": HFCase(distilbert, ("distilbert.transformer.layer",), "cls"),
    "roberta": HFCase(roberta_classifier, ("roberta.encoder.layer",), "cls"),
    "roberta-mlm": HFCase(roberta_mlm, (), "mlm"),
    "electra": HFCase(electra, (), "cls"),
    "albert-mlm": HFCase(albert, (), "mlm"),
    "llama": HFCase(llama, ("model.layers",), "lm"),
    "mistral": HFCase(mistral, ("model.layers",), "lm"),
    "qwen2": HFCase(qwen2, ("model.layers",), "lm"),
    "gemma": HFCase(gemma, (), "lm"),
    "phi": HFCase(phi, (), "lm"),
    "gpt_neox": HFCase(gpt_neox, ("gpt_neox.layers",), "lm"),
    "opt": HFCase(opt, ("model.decoder.layers",), "lm"),
    "t5": HFCase(t5, ("encoder.block", "decoder.block"), "s2s"),
    "bart": HFCase(bart, ("model.encoder.layers", "model.decoder.layers"), "s2s"),
    "vit": HFCase(vit, ("vit.layers",), "img"),
    "swin": HFCase(swin, (), "img"),
    "deberta-v2-mlm": HFCase(deberta_v2_mlm, (), "mlm"),
    "bloom": HFCase(bloom, (), "lm"),
    "falcon": HFCase(falcon, (), "lm"),
    "qwen3": HFCase(qwen3, (), "lm"),
    "gemma2": HFCase(gemma2, (), "lm"),
    "mixtral": HFCase(mixtral, (), "lm"),
    "mobilebert": HFCase(mobilebert, (), "cls"),
    "whisper": HFCase(whisper, (), "audio-s2s"),
    "beit": HFCase(beit, (), "img"),
    "dinov2": HFCase(dinov2, (), "img"),
    "convnext": HFCase(convnext, (), "img"),
    "segformer": HFCase(segformer, (), "seg"),
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
        x = torch.randn(12, 3, IMAGE, IMAGE, generator=generator)
        y = torch.randint(0, 3, (12,), generator=generator)
    else:
        x = torch.randint(0, VOCAB, (12, length), generator=generator)
        y = torch.randint(0, VOCAB, (12, length), generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=4)
