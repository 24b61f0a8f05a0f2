"""A small CNN with BatchNorm on scikit-learn's handwritten digits, for training with ``strategy="ort"``.

The data (1,797 grey-scale 8x8 images of the digits 0-9) ships inside the scikit-learn wheel, so
nothing is downloaded. Run from the repository root::

    lightning-ort fit --config examples/cnn_digits/configs/ort.yaml     # compute in ONNX Runtime
    lightning-ort fit --config examples/cnn_digits/configs/eager.yaml   # plain PyTorch
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

NUM_CLASSES = 10


class DigitsDataModule(pl.LightningDataModule):
    """scikit-learn's ``load_digits`` as ``(image, label)`` batches: images ``(batch, 1, 8, 8)`` in [0, 1].

    The split into training and validation images is stratified by digit and seeded, so it is the
    same on every run.

    Args:
        batch_size: images per batch.
        val_fraction: share of the 1,797 images held out for validation.
        seed: seed of the split and of the training-set shuffling.
        num_workers: DataLoader worker processes.
    """

    def __init__(self, batch_size: int = 64, val_fraction: float = 0.2, seed: int = 0, num_workers: int = 0) -> None:
        super().__init__()
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"DigitsDataModule(val_fraction={val_fraction!r}) must be between 0 and 1.")
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.num_workers = num_workers
        self.train_dataset: TensorDataset | None = None
        self.val_dataset: TensorDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        """Load the digits from scikit-learn's package data and split them."""
        if self.train_dataset is not None:
            return
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        images, labels = load_digits(return_X_y=True)
        x_train, x_val, y_train, y_val = train_test_split(
            images, labels, test_size=self.val_fraction, stratify=labels, random_state=self.seed
        )
        self.train_dataset = self._dataset(x_train, y_train)
        self.val_dataset = self._dataset(x_val, y_val)

    @staticmethod
    def _dataset(images: object, labels: object) -> TensorDataset:
        pixels = torch.as_tensor(images, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0  # pixel values are 0..16
        return TensorDataset(pixels, torch.as_tensor(labels, dtype=torch.long))

    def train_dataloader(self) -> DataLoader:
        """Shuffled training batches (seeded)."""
        assert self.train_dataset is not None, "call setup() first"
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(
            self.train_dataset,
            batch_size=self.batch_size,
            shuffle=True,
            generator=generator,
            num_workers=self.num_workers,
        )

    def val_dataloader(self) -> DataLoader:
        """Validation batches."""
        assert self.val_dataset is not None, "call setup() first"
        return DataLoader(self.val_dataset, batch_size=self.batch_size, num_workers=self.num_workers)


def conv_block(in_channels: int, out_channels: int) -> nn.Sequential:
    """3x3 convolution (no bias: BatchNorm follows), BatchNorm and ReLU."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(),
    )


class DigitsCNN(pl.LightningModule):
    """Three convolution blocks with BatchNorm, global average pooling and a linear classifier.

    ``forward(images)`` maps ``(batch, 1, 8, 8)`` images to ``(batch, 10)`` logits; the loss and the
    torchmetrics accuracy and macro F1 are computed in the steps, in PyTorch.

    Args:
        channels: output channels of the first block (the second and third have 2x and 4x as many).
        dropout: dropout before the classifier.
        lr: Adam learning rate.
    """

    def __init__(self, channels: int = 16, dropout: float = 0.0, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.features = nn.Sequential(
            conv_block(1, channels),
            conv_block(channels, 2 * channels),
            nn.MaxPool2d(2),  # 8x8 -> 4x4
            conv_block(2 * channels, 4 * channels),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(4 * channels, NUM_CLASSES))
        self.train_acc = MulticlassAccuracy(NUM_CLASSES, average="micro")
        self.val_acc = MulticlassAccuracy(NUM_CLASSES, average="micro")
        self.val_f1 = MulticlassF1Score(NUM_CLASSES, average="macro")

    def forward(self, images: Tensor) -> Tensor:
        return self.classifier(self.features(images))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, labels = batch
        logits = self(images)
        loss = F.cross_entropy(logits, labels)
        self.train_acc(logits, labels)
        self.log("train_loss", loss, prog_bar=True)
        self.log("train_acc", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        images, labels = batch
        logits = self(images)
        self.val_acc(logits, labels)
        self.val_f1(logits, labels)
        self.log("val_loss", F.cross_entropy(logits, labels), prog_bar=True)
        self.log("val_acc", self.val_acc, prog_bar=True)
        self.log("val_f1", self.val_f1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
