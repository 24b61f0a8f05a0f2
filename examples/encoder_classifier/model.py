"""Which of two Shakespeare characters speaks a line? A transformer encoder classifier on the tiny
Shakespeare text shipped with the GPT example, for training with ``strategy="ort"``.

Every line of verse spoken by one of the chosen characters is one example, labelled with its speaker.
Whole speeches go either to training or to validation, so validation lines come from speeches the
model never saw. Batches are dicts with ``input_ids``, ``attention_mask`` (1 for words, 0 for padding)
and ``labels``. Every batch is padded to ``max_len`` words, or with ``fixed_length=False`` to its
longest line (ORT trains both, with one graph for every length). Run from the repository root::

    lightning-ort fit --config examples/encoder_classifier/configs/ort.yaml     # compute in ONNX Runtime
    lightning-ort fit --config examples/encoder_classifier/configs/eager.yaml   # plain PyTorch
"""

from __future__ import annotations

import functools
import random
import re
from collections import Counter
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

DEFAULT_CORPUS = Path(__file__).resolve().parents[1] / "gpt" / "data" / "tinyshakespeare.txt"
PAD, UNK = 0, 1
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)*|[^\sa-z]")

Batch = dict[str, Tensor]


def words(line: str) -> list[str]:
    """Lower-cased words and punctuation marks of ``line``."""
    return _WORD.findall(line.lower())


def speeches(text: str, speakers: list[str]) -> list[tuple[int, list[str]]]:
    """``(speaker index, lines)`` of every speech in ``text`` by one of ``speakers``.

    The text is a play script: a speech is a paragraph whose first line is ``NAME:``.
    """
    found = []
    for paragraph in text.split("\n\n"):
        lines = paragraph.strip().split("\n")
        name = lines[0].removesuffix(":")
        if lines[0].endswith(":") and name in speakers:
            found.append((speakers.index(name), [line for line in lines[1:] if line.strip()]))
    return found


class Vocabulary:
    """Word ids: 0 is padding, 1 stands for any word outside the ``size - 2`` most frequent ones."""

    def __init__(self, lines: list[list[str]], size: int) -> None:
        counts = Counter(word for line in lines for word in line)
        self.itos = ["<pad>", "<unk>"] + [word for word, _ in counts.most_common(size - 2)]
        self.stoi = {word: index for index, word in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, line: list[str]) -> list[int]:
        return [self.stoi.get(word, UNK) for word in line]


class LineDataset(Dataset[tuple[list[int], int]]):
    """Encoded lines and their speaker labels."""

    def __init__(self, ids: list[list[int]], labels: list[int]) -> None:
        self.ids = ids
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[list[int], int]:
        return self.ids[index], self.labels[index]


def collate(items: list[tuple[list[int], int]], length: int | None = None) -> Batch:
    """Pad a list of ``(ids, label)`` to ``length`` words, or to the longest line of the batch if ``None``."""
    length = length or max(len(ids) for ids, _ in items)
    input_ids = torch.full((len(items), length), PAD, dtype=torch.long)
    attention_mask = torch.zeros((len(items), length), dtype=torch.long)
    for row, (ids, _) in enumerate(items):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, : len(ids)] = 1
    labels = torch.tensor([label for _, label in items], dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


class SpeakerDataModule(pl.LightningDataModule):
    """Lines of the given Shakespeare characters, labelled with the index of their speaker.

    Args:
        speakers: the characters to tell apart, as named in the text (upper case).
        path: the play text; the tiny Shakespeare copy shipped with ``examples/gpt`` by default.
        vocab_size: word ids, including padding and unknown (the most frequent training words get one).
        max_len: lines are cut to this many words and punctuation marks.
        val_fraction: share of the speeches (not lines) held out for validation.
        batch_size: lines per batch.
        seed: seed of the speech split and of the training-set shuffling.
        fixed_length: pad every batch to ``max_len`` (``False``: to its longest line).
    """

    def __init__(
        self,
        speakers: list[str] | None = None,
        path: str | Path = DEFAULT_CORPUS,
        vocab_size: int = 2000,
        max_len: int = 32,
        val_fraction: float = 0.2,
        batch_size: int = 32,
        seed: int = 0,
        fixed_length: bool = True,
    ) -> None:
        super().__init__()
        self.speakers = list(speakers) if speakers is not None else ["ROMEO", "MENENIUS"]
        if len(self.speakers) < 2:
            raise ValueError(f"SpeakerDataModule(speakers={self.speakers!r}) needs at least two speakers.")
        self.path = Path(path)
        self.vocab_size = vocab_size
        self.max_len = max_len
        self.val_fraction = val_fraction
        self.batch_size = batch_size
        self.seed = seed
        self.fixed_length = fixed_length
        self.vocab: Vocabulary | None = None
        self.train_dataset: LineDataset | None = None
        self.val_dataset: LineDataset | None = None

    @property
    def num_classes(self) -> int:
        """Number of speakers."""
        return len(self.speakers)

    def setup(self, stage: str | None = None) -> None:
        """Split the speeches, build the vocabulary from the training lines and encode every line."""
        if self.train_dataset is not None:
            return
        found = speeches(self.path.read_text(encoding="utf-8"), self.speakers)
        missing = set(self.speakers) - {self.speakers[label] for label, _ in found}
        if missing:
            raise ValueError(f"No speech by {', '.join(sorted(missing))} in {self.path}.")
        random.Random(self.seed).shuffle(found)
        n_val = max(1, round(self.val_fraction * len(found)))
        splits = {"val": found[:n_val], "train": found[n_val:]}
        lines = {
            name: [(words(line)[: self.max_len], label) for label, speech in split for line in speech]
            for name, split in splits.items()
        }
        lines = {name: [(line, label) for line, label in pairs if line] for name, pairs in lines.items()}
        self.vocab = Vocabulary([line for line, _ in lines["train"]], self.vocab_size)
        self.train_dataset, self.val_dataset = (
            LineDataset([self.vocab.encode(line) for line, _ in lines[name]], [label for _, label in lines[name]])
            for name in ("train", "val")
        )

    def train_dataloader(self) -> DataLoader[Batch]:
        """Shuffled (seeded) training batches."""
        assert self.train_dataset is not None, "call setup() first"
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(
            self.train_dataset, batch_size=self.batch_size, shuffle=True, generator=generator, collate_fn=self._collate
        )

    def val_dataloader(self) -> DataLoader[Batch]:
        """Validation batches."""
        assert self.val_dataset is not None, "call setup() first"
        return DataLoader(self.val_dataset, batch_size=self.batch_size, collate_fn=self._collate)

    @property
    def _collate(self) -> functools.partial[Batch]:
        return functools.partial(collate, length=self.max_len if self.fixed_length else None)


class EncoderClassifier(pl.LightningModule):
    """Word embeddings, learned positions, ``nn.TransformerEncoder`` with a padding mask, mean pooling
    over the real words and a linear classifier.

    ``forward(input_ids, attention_mask)`` maps ``(batch, seq_len)`` word ids and mask to
    ``(batch, num_classes)`` logits; the loss and the torchmetrics accuracy and macro F1 are computed
    in the steps, in PyTorch.

    Args:
        vocab_size: word ids the embedding covers; at least the data module's ``vocab_size``.
        num_classes: number of speakers.
        d_model: width of the embeddings and of the encoder.
        n_heads: attention heads per layer.
        n_layers: encoder layers.
        dim_feedforward: hidden width of each layer's feed-forward block.
        max_len: longest line (in words) the positional embedding covers.
        dropout: dropout in the encoder and before the classifier.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
    """

    def __init__(
        self,
        vocab_size: int = 2000,
        num_classes: int = 2,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        dim_feedforward: int = 128,
        max_len: int = 32,
        dropout: float = 0.1,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=PAD)
        self.positions = nn.Parameter(torch.zeros(1, max_len, d_model))
        layer = nn.TransformerEncoderLayer(
            d_model, n_heads, dim_feedforward, dropout, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, n_layers, norm=nn.LayerNorm(d_model), enable_nested_tensor=False)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(d_model, num_classes))
        nn.init.normal_(self.positions, std=0.02)
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_f1 = MulticlassF1Score(num_classes, average="macro")

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        for name in ("vocab_size", "num_classes"):
            given = getattr(datamodule, name, None)
            if given is not None and given > self.hparams[name]:
                raise ValueError(
                    f"The data has {name}={given} but EncoderClassifier({name}={self.hparams[name]}); "
                    f"give the model a {name} of at least {given}."
                )

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        x = self.embedding(input_ids) + self.positions[:, : input_ids.shape[1]]
        x = self.encoder(x, src_key_padding_mask=attention_mask == 0)
        mask = attention_mask.unsqueeze(-1).to(x.dtype)
        pooled = (x * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        return self.head(pooled)

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        logits = self(batch["input_ids"], batch["attention_mask"])
        labels = batch["labels"]
        loss = F.cross_entropy(logits, labels)
        self.train_acc(logits, labels)
        self.log("train_loss", loss, prog_bar=True, batch_size=len(labels))
        self.log("train_acc", self.train_acc, on_step=False, on_epoch=True, batch_size=len(labels))
        return loss

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        logits = self(batch["input_ids"], batch["attention_mask"])
        labels = batch["labels"]
        self.val_acc(logits, labels)
        self.val_f1(logits, labels)
        self.log("val_loss", F.cross_entropy(logits, labels), prog_bar=True, batch_size=len(labels))
        self.log("val_acc", self.val_acc, prog_bar=True, batch_size=len(labels))
        self.log("val_f1", self.val_f1, batch_size=len(labels))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
