"""Reference workloads of the benchmark: the same model, data and optimizer for every mode."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "gpt"))

from model import GPT  # noqa: E402

Batch = tuple[Any, torch.Tensor]  # (the model's input: a tensor, or a dict of keyword arguments; the target)


class Unavailable(ImportError):
    """A workload's model comes from a library that does not import in this environment."""


def call(model: Callable[..., Any], x: Any) -> Any:
    """``model`` on a batch's input: a tensor positionally, a dict (Hugging Face style) as keyword arguments."""
    return model(**x) if isinstance(x, dict) else model(x)


@dataclass(frozen=True)
class Workload:
    """A model, its batches, its loss and its optimizer."""

    name: str
    make_model: Callable[[], nn.Module]
    make_batch: Callable[[torch.Generator], Batch]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer]

    def train_step(self, model: Callable[..., Any], optimizer: torch.optim.Optimizer, batch: Batch) -> None:
        """One optimizer step of ``model`` (eager or ORTModule) on ``batch``, as every mode takes it."""
        x, y = batch
        self.loss(call(model, x), y).backward()
        optimizer.step()
        optimizer.zero_grad()


class GPTBody(nn.Module):
    """The example GPT without its Lightning shell: token ids in, logits out."""

    def __init__(self, vocab: int, d_model: int, layers: int, seq_len: int) -> None:
        super().__init__()
        gpt = GPT(vocab_size=vocab, d_model=d_model, n_heads=4, n_layers=layers, max_seq_len=seq_len)
        self.tok_emb, self.pos_emb, self.blocks, self.ln_f, self.head = (
            gpt.tok_emb,
            gpt.pos_emb,
            gpt.blocks,
            gpt.ln_f,
            gpt.head,
        )

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(idx) + self.pos_emb[:, : idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100)


def _gpt(name: str, vocab: int, d_model: int, layers: int, seq: int, batch: int, pad: float) -> Workload:
    def make_batch(g: torch.Generator) -> Batch:
        window = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        target = window[:, 1:].clone()
        if pad:
            target[torch.rand(target.shape, generator=g) < pad] = -100
        return window[:, :-1], target

    return Workload(
        name,
        lambda: GPTBody(vocab, d_model, layers, seq),
        make_batch,
        _lm_loss,
        lambda params: torch.optim.AdamW(params, lr=3e-4),
    )


class Encoder(nn.Module):
    def __init__(self, vocab: int, d_model: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, 4, 4 * d_model, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = ids != 0
        hidden = self.encoder(self.embed(ids), src_key_padding_mask=~mask)
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return self.head((hidden * weights).sum(1) / weights.sum(1).clamp(min=1))


def _encoder(scale: int) -> Workload:
    batch, seq, vocab = 16 * scale, 64, 2000

    def make_batch(g: torch.Generator) -> Batch:
        ids = torch.randint(1, vocab, (batch, seq), generator=g)
        lengths = torch.randint(seq // 4, seq + 1, (batch,), generator=g)
        ids[torch.arange(seq)[None, :] >= lengths[:, None]] = 0
        return ids, torch.randint(0, 2, (batch,), generator=g)

    return Workload(
        "encoder",
        lambda: Encoder(vocab, 128, 2),
        make_batch,
        F.cross_entropy,
        lambda params: torch.optim.AdamW(params, lr=1e-4),
    )


def _cnn(scale: int) -> Workload:
    batch = 32 * scale

    def make_model() -> nn.Module:
        def block(cin: int, cout: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

        return nn.Sequential(
            *block(3, 32),
            *block(32, 32),
            nn.MaxPool2d(2),
            *block(32, 64),
            *block(64, 64),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 8 * 8, 10),
        )

    def make_batch(g: torch.Generator) -> Batch:
        return torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)

    return Workload(
        "cnn", make_model, make_batch, F.cross_entropy, lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9)
    )


class UNet(nn.Module):
    """A two-level U-Net for per-pixel classification: skip connections concatenated with upsampled features."""

    def __init__(self, channels: int) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Module:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

        c = channels
        self.down1, self.down2, self.bottom = block(3, c), block(c, 2 * c), block(2 * c, 4 * c)
        self.up2, self.up1 = block(6 * c, 2 * c), block(3 * c, c)
        self.out = nn.Conv2d(c, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip1 = self.down1(x)
        skip2 = self.down2(F.max_pool2d(skip1, 2))
        bottom = self.bottom(F.max_pool2d(skip2, 2))
        up2 = self.up2(torch.cat([F.interpolate(bottom, scale_factor=2.0), skip2], 1))
        return self.out(self.up1(torch.cat([F.interpolate(up2, scale_factor=2.0), skip1], 1)))


def _unet(batch: int, size: int, channels: int) -> Workload:
    def make_batch(g: torch.Generator) -> Batch:
        return torch.randn(batch, 3, size, size, generator=g), torch.randint(0, 2, (batch, size, size), generator=g)

    return Workload(
        "unet",
        lambda: UNet(channels),
        make_batch,
        F.cross_entropy,
        lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
    )


def _mlp(scale: int) -> Workload:
    batch, width = 128 * scale, 1024

    def make_model() -> nn.Module:
        return nn.Sequential(
            nn.Linear(784, width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, 10),
        )

    def make_batch(g: torch.Generator) -> Batch:
        return torch.randn(batch, 784, generator=g), torch.randint(0, 10, (batch,), generator=g)

    return Workload("mlp", make_model, make_batch, F.cross_entropy, lambda params: torch.optim.SGD(params, lr=0.01))


def _library_model(library: str, build: Callable[[Any], nn.Module]) -> Callable[[], nn.Module]:
    """A model of ``library`` (torchvision, timm), imported only when a run builds it."""

    def make() -> nn.Module:
        try:
            module = importlib.import_module(library)
        except Exception as error:  # PyPI's torchvision is a CUDA build that fails to import beside torch's CPU build
            raise Unavailable(f"{library} does not import here ({type(error).__name__}: {str(error)[:200]})") from error
        return build(module)

    return make


def _vision(name: str, library: str, build: Callable[[Any], nn.Module], batch: int, size: int) -> Workload:
    """An image classifier of a real library, random weights, 10 classes."""

    def make_batch(g: torch.Generator) -> Batch:
        return torch.randn(batch, 3, size, size, generator=g), torch.randint(0, 10, (batch,), generator=g)

    return Workload(
        name,
        _library_model(library, build),
        make_batch,
        F.cross_entropy,
        lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
    )


def _library_workloads(batch: int, size: int) -> list[Workload]:
    """torchvision's ResNet-18, MobileNetV3-small, EfficientNet-B0 and ConvNeXt-Tiny, timm's ResNet-18d and
    ViT-Tiny (#31's models), with their libraries' defaults (dropout, stochastic depth) but 10 classes."""
    return [
        _vision("resnet18", "torchvision.models", lambda m: m.resnet18(num_classes=10), batch, size),
        _vision("resnet18d", "timm", lambda m: m.create_model("resnet18d", num_classes=10), batch, size),
        _vision("mobilenetv3", "torchvision.models", lambda m: m.mobilenet_v3_small(num_classes=10), batch, size),
        _vision("efficientnet_b0", "torchvision.models", lambda m: m.efficientnet_b0(num_classes=10), batch, size),
        _vision("convnext_tiny", "torchvision.models", lambda m: m.convnext_tiny(num_classes=10), batch, size),
        _vision(
            "vit_tiny",
            "timm",
            lambda m: m.create_model("vit_tiny_patch16_224", img_size=size, patch_size=size // 8, num_classes=10),
            batch,
            size,
        ),
    ]


def _hf_loss(output: Any, target: torch.Tensor) -> torch.Tensor:
    """The loss a Hugging Face model computed from the ``labels`` in its inputs."""
    return output.loss


def _padding_mask(batch: int, seq: int, g: torch.Generator) -> torch.Tensor:
    """A tokenizer's attention mask for a padded batch: each sequence 1/4 to all of ``seq`` tokens long."""
    lengths = torch.randint(seq // 4, seq + 1, (batch,), generator=g)
    lengths[0] = seq  # the longest sequence sets the padded length
    return (torch.arange(seq)[None, :] < lengths[:, None]).long()


def _transformers(
    name: str,
    model_class: str,
    config_class: str,
    config: dict[str, Any],
    make_batch: Callable[[torch.Generator], Batch],
) -> Workload:
    """A transformers model from a config (random weights, nothing downloaded), its loss computed inside."""

    def build(module: Any) -> nn.Module:
        return getattr(module, model_class)(getattr(module, config_class)(**config))

    return Workload(
        name,
        _library_model("transformers", build),
        make_batch,
        _hf_loss,
        lambda params: torch.optim.AdamW(params, lr=1e-4),
    )


def _hf_workloads(hidden: int, layers: int, heads: int, seq: int, batch: int, vocab: int) -> list[Workload]:
    """A BERT classifier on a padded batch, a GPT-2 and a Llama causal LM (the Llama on a padded batch)."""

    def classification(g: torch.Generator) -> Batch:
        ids = torch.randint(3, vocab, (batch, seq), generator=g)
        mask = _padding_mask(batch, seq, g)
        labels = torch.randint(0, 2, (batch,), generator=g)
        return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask, "labels": labels}, labels

    def causal_lm(padded: bool) -> Callable[[torch.Generator], Batch]:
        def make_batch(g: torch.Generator) -> Batch:
            ids = torch.randint(3, vocab, (batch, seq), generator=g)
            if not padded:
                return {"input_ids": ids, "labels": ids}, ids
            mask = _padding_mask(batch, seq, g)
            labels = ids.masked_fill(mask == 0, -100)
            return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask, "labels": labels}, labels

        return make_batch

    sizes = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads)
    bert = dict(sizes, intermediate_size=4 * hidden, max_position_embeddings=max(seq, 16), num_labels=2)
    gpt2 = dict(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=max(seq, 16))
    gpt2.update(bos_token_id=1, eos_token_id=2)  # GPT-2's own ids (50256) are outside this vocabulary
    llama = dict(sizes, intermediate_size=(8 * hidden) // 3, num_key_value_heads=max(heads // 2, 1))
    llama["max_position_embeddings"] = max(seq, 16)
    return [
        _transformers("bert", "BertForSequenceClassification", "BertConfig", bert, classification),
        _transformers("gpt2", "GPT2LMHeadModel", "GPT2Config", gpt2, causal_lm(padded=False)),
        _transformers("llama", "LlamaForCausalLM", "LlamaConfig", llama, causal_lm(padded=True)),
    ]


def workloads(size: str) -> dict[str, Workload]:
    """The reference workloads at ``size`` ("tiny" for smoke tests, "full" for measurements)."""
    if size == "tiny":
        items = [
            _gpt("gpt", 128, 32, 1, 16, 2, 0.0),
            _gpt("gpt_padded", 512, 32, 1, 16, 2, 0.5),
            _encoder(1),
            _cnn(1),
            _unet(2, 16, 4),
            _mlp(1),
            *_library_workloads(2, 32),
            *_hf_workloads(32, 1, 2, 16, 2, 128),
        ]
    elif size == "full":
        items = [
            _gpt("gpt", 1000, 256, 4, 128, 8, 0.0),
            _gpt("gpt_padded", 8000, 256, 4, 128, 8, 0.48),
            _encoder(2),
            _cnn(2),
            _unet(8, 64, 32),
            _mlp(4),
            *_library_workloads(4, 64),
            *_hf_workloads(256, 4, 4, 128, 8, 8000),
        ]
    else:
        raise ValueError(f"size must be 'tiny' or 'full', not {size!r}")
    return {w.name: w for w in items}
