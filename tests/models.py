"""Small LightningModules covering the module families users train."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset


class Base(L.LightningModule):
    lr = 0.05

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class MLP(Base):
    def __init__(self, width: int = 32, dropout: float = 0.0) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(16, width), nn.ReLU(), nn.Dropout(dropout), nn.Linear(width, width), nn.Tanh()
        )
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))


class Between(Base):
    """A linear layer, ``function`` on its output, a residual and a head over the mean position."""

    def __init__(self, function: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.function = function
        self.inner, self.head = nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inner(x)
        return self.head((h + self.function(h)).mean(1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


def mlp_loader(batch_size: int = 16, n: int = 320) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    return DataLoader(
        TensorDataset(torch.randn(n, 16, generator=g), torch.randint(0, 3, (n,), generator=g)), batch_size
    )


def sequence_batches(shapes: list[tuple[int, int]], features: int, seed: int = 0) -> DataLoader:
    """(x, y) batches of the given (batch, length) sizes: x of ``features`` channels, y of 3 classes."""
    g = torch.Generator().manual_seed(seed)
    batches = [
        (torch.randn(batch, length, features, generator=g), torch.randint(0, 3, (batch,), generator=g))
        for batch, length in shapes
    ]
    return DataLoader(batches, batch_size=None)


class SequenceClassifier(Base):
    """Classifies (batch, length, 8) sequences with Adam (``forward`` left to subclasses)."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)


def varying_sequences() -> DataLoader:
    """Batches of varying size and length, a single step and a single sequence among them."""
    return sequence_batches([(4, 6), (2, 9), (3, 1), (1, 6)], 8)


class CNN(Base):
    """Convolutions with BatchNorm (running statistics must follow eager) on ``image_size`` square images."""

    def __init__(self, channels: int = 8, hidden: int = 16, image_size: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels, momentum=0.3),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        flat = channels * (image_size // 2) ** 2
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(flat, hidden), nn.BatchNorm1d(hidden), nn.Linear(hidden, 4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))

    training_step = MLP.training_step
    validation_step = MLP.validation_step


def image_loader(batch_size: int = 16, n: int = 200) -> DataLoader:
    g = torch.Generator().manual_seed(2)
    return DataLoader(
        TensorDataset(torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 4, (n,), generator=g)), batch_size
    )


class DictBatches(Dataset):
    """Token sequences of varying true length, padded, as dict samples with an attention mask."""

    def __init__(self, n: int = 256, seq_len: int = 12, vocab: int = 50) -> None:
        g = torch.Generator().manual_seed(3)
        self.ids = torch.randint(1, vocab, (n, seq_len), generator=g)
        lengths = torch.randint(3, seq_len + 1, (n,), generator=g)
        self.mask = torch.arange(seq_len)[None, :] < lengths[:, None]
        self.ids[~self.mask] = 0
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "label": self.labels[i]}


def dict_loader(batch_size: int = 16) -> DataLoader:
    return DataLoader(DictBatches(), batch_size)


class EncoderClassifier(Base):
    """Embeddings + nn.TransformerEncoder with a padding mask; forward takes a dict, returns a dict."""

    lr = 0.01

    def __init__(self, vocab: int = 50, d_model: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model, padding_idx=0)
        layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 2)

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        mask = batch["attention_mask"]
        hidden = self.encoder(self.embed(batch["input_ids"]), src_key_padding_mask=~mask)
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1)
        return {"logits": self.head(pooled), "pooled": pooled}

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = F.cross_entropy(self(batch)["logits"], batch["label"])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", F.cross_entropy(self(batch)["logits"], batch["label"]))


class TupleOutput(MLP):
    """forward returns a tuple (logits, features)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.body(x)
        return self.head(features), features

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits, features = self(x)
        return F.cross_entropy(logits, y) + 1e-3 * features.pow(2).mean()


class ChildrenOnly(MLP):
    """Steps call the children directly and never self(...)."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.head(self.body(x)), y)


class StraightThrough(torch.autograd.Function):
    """Sign in the forward, identity gradient in the backward (a straight-through estimator)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return torch.sign(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class STEModel(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(StraightThrough.apply(self.body(x)))


class DataDependent(MLP):
    """Python control flow on a tensor value: a trace would freeze one branch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.body(x)
        if hidden.mean() > 0:
            hidden = hidden * 2
        return self.head(hidden)


class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x


class BufferWriter(MLP):
    """A forward that writes a buffer in place (ONNX graphs cannot)."""

    def __init__(self) -> None:
        super().__init__()
        self.counter = Counter()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.counter(self.body(x)))


class BufferCopier(MLP):
    """A forward that writes a running mean with ``buffer.copy_(...)``, which torch cannot export at all."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("running", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        self.running.copy_(0.9 * self.running + 0.1 * logits.detach().mean(0))
        return logits - self.running


class DetachModel(MLP):
    """Stop-gradients through ``.detach()``: a straight-through rounding and a detached target."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.body(x)
        quantized = hidden + (torch.sign(hidden) * hidden.abs().sqrt() - hidden).detach()
        return self.head(quantized) + 0.1 * self.head(hidden).detach()


class NoGradInForward(MLP):
    """Part of the forward under torch.no_grad(): eager computes no gradient through it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = self.head(self.body(x))
        return self.head(self.body(x)) + 0.5 * target


class GradSwitchedOff(MLP):
    """``torch.set_grad_enabled(False)`` in the forward, around a computation from parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.set_grad_enabled(False)
        target = self.head(self.body(x))
        torch.set_grad_enabled(True)
        return self.head(self.body(x)) + 0.5 * target


class PythonCounter(MLP):
    """The forward changes a plain Python attribute: a traced graph would freeze it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.head(self.body(x)) * (1.0 + 0.01 * (self.calls % 3))


class PerSampleLoop(MLP):
    """A Python loop over the batch: the trace would unroll it for the first batch's size."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.stack([self.body(x[i]) for i in range(x.shape[0])]))


class BufferReplacer(MLP):
    """A running mean kept by assigning a new tensor to a buffer (VQ-VAE codebooks do this)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.body(x)
        if self.training:
            self.mean = 0.9 * self.mean + 0.1 * hidden.detach().mean(0)
        return self.head(hidden - self.mean)


class MaxNormEmbedding(MLP):
    """``nn.Embedding(max_norm=...)`` renormalises the rows it looks up, in place."""

    def __init__(self, sparse: bool = False) -> None:
        super().__init__()
        self.embedding = nn.Embedding(20, 16, max_norm=None if sparse else 1.0, sparse=sparse)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = (x.abs() * 5).long().clamp(max=19)
        return self.head(self.body(x + self.embedding(ids).mean(1)))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class SparseEmbedding(MaxNormEmbedding):
    """``nn.Embedding(sparse=True)``: sparse gradients, which ORT cannot produce."""

    def __init__(self) -> None:
        super().__init__(sparse=True)


class InPlaceInput(MLP):
    """Changes its input in place, and the loss uses the input again: eager sees the change."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x[:, 0] = 0.0
        return self.head(self.body(x.mul_(2)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y) + x.pow(2).mean()


class HookedFeatures(MLP):
    """A forward hook on a submodule captures features for an extra loss term."""

    def __init__(self) -> None:
        super().__init__()
        self.features: list[torch.Tensor] = []
        self.body.register_forward_hook(self.capture)  # a bound method: deep copies capture into their own list

    def capture(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        self.features.append(output)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.features.clear()
        loss = super().training_step(batch, batch_idx)
        return loss + 0.1 * self.features[-1].pow(2).mean()


class BackwardHooked(MLP):
    """A full backward hook on a submodule halves the gradient flowing into it from the head."""

    def __init__(self) -> None:
        super().__init__()
        self.head.register_full_backward_hook(self.halve)  # a bound method: deep copies keep their own

    def halve(self, module: nn.Module, grad_input: Any, grad_output: Any) -> tuple[torch.Tensor, ...]:
        return tuple(None if grad is None else grad * 0.5 for grad in grad_input)


class TensorHookInForward(MLP):
    """The forward registers a hook that halves the gradient of its hidden features."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.body(x)
        hidden.register_hook(lambda grad: grad * 0.5)
        return self.head(hidden)


class RequiresGradBranch(MLP):
    """The forward registers that hook only where gradients flow, as code that also runs in validation does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.body(x)
        if hidden.requires_grad:
            hidden.register_hook(lambda grad: grad * 0.5)
        return self.head(hidden)


class StoredAuxLoss(MLP):
    """The forward stores an auxiliary loss on the module, which ``training_step`` adds (MoE style)."""

    def __init__(self) -> None:
        super().__init__()
        self.aux_loss = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.body(x)
        self.aux_loss = hidden.pow(2).mean()
        return self.head(hidden)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return super().training_step(batch, batch_idx) + 0.5 * self.aux_loss
