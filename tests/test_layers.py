"""PReLU, InstanceNorm, GroupNorm and BatchNorm without running statistics or affine parameters, adaptive max
pooling and EmbeddingBag train in ORT like eager (layers.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base, sequence_batches
from torch import nn
from torch.utils.data import DataLoader

from lightning_ort import ORTStrategy


class ImageNet(Base):
    """A convolution, ``layer``, and a head over the pooled channels (images built from sequences)."""

    def __init__(self, layer: nn.Module, frozen: str = "") -> None:
        super().__init__()
        self.conv, self.layer, self.head = nn.Conv2d(8, 8, 3, padding=1), layer, nn.Linear(8, 3)
        for name, parameter in layer.named_parameters():
            parameter.requires_grad_(name != frozen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, channels = x.shape
        images = x.transpose(1, 2).reshape(batch, channels, length, 1) * x.transpose(1, 2).reshape(
            batch, channels, 1, length
        )
        return self.head(self.layer(self.conv(images)).flatten(2).mean(2))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


class Lambda(nn.Module):
    def __init__(self, function: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.function = function

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(x)


def images() -> DataLoader:
    return sequence_batches([(4, 6), (2, 9), (3, 2), (4, 7)], 8)


IMAGE_MODELS: dict[str, Callable[[], Base]] = {
    "prelu": lambda: ImageNet(nn.PReLU(8, init=0.1)),
    "prelu-shared": lambda: ImageNet(nn.PReLU()),
    "prelu-frozen": lambda: ImageNet(nn.PReLU(8), frozen="weight"),
    "instance-norm": lambda: ImageNet(nn.InstanceNorm2d(8)),
    "instance-norm-affine": lambda: ImageNet(nn.InstanceNorm2d(8, affine=True, eps=1e-3)),
    "instance-norm-frozen-bias": lambda: ImageNet(nn.InstanceNorm2d(8, affine=True), frozen="bias"),
    "batch-norm-batch-statistics": lambda: ImageNet(nn.BatchNorm2d(8, track_running_stats=False)),
    "batch-norm-batch-statistics-plain": lambda: ImageNet(nn.BatchNorm2d(8, affine=False, track_running_stats=False)),
    "batch-norm-batch-statistics-frozen-weight": lambda: ImageNet(
        nn.BatchNorm2d(8, track_running_stats=False), frozen="weight"
    ),
    "group-norm-plain": lambda: ImageNet(nn.GroupNorm(4, 8, affine=False)),
    "group-norm-plain-one-group": lambda: ImageNet(nn.GroupNorm(1, 8, eps=1e-3, affine=False)),
    # scaled by a 0-d tensor, the export no longer knows the channels torch's BatchNorm export needs without weights
    "batch-norm-plain-after-scaling": lambda: ImageNet(
        nn.Sequential(Lambda(lambda h: h * (h.detach().abs().mean() + 0.5)), nn.BatchNorm2d(8, affine=False))
    ),
    "adaptive-max-pool": lambda: ImageNet(Lambda(lambda h: F.adaptive_max_pool2d(h, (3, 2)))),
    "adaptive-max-pool-1d": lambda: ImageNet(Lambda(lambda h: F.adaptive_max_pool1d(h.flatten(2), 5))),
    "adaptive-max-pool-3d": lambda: ImageNet(Lambda(lambda h: F.adaptive_max_pool3d(h.unsqueeze(2), (1, 2, 3)))),
}


@pytest.mark.parametrize("make_model", IMAGE_MODELS.values(), ids=IMAGE_MODELS.keys())
def test_layer_trains_in_ort_like_eager(make_model: Callable[[], Base]) -> None:
    eager, ort = fit_both(make_model, images, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class Bags(Base):
    """An EmbeddingBag over token ids (every row in use, the last one included), and a head."""

    def __init__(self, bags: Callable[[], nn.EmbeddingBag], offsets: bool) -> None:
        super().__init__()
        self.bags, self.offsets, self.head = bags(), offsets, nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = (x.abs() * 7).long().clamp(max=19)[..., 0]
        if not self.offsets:
            return self.head(self.bags(ids))
        # bags of varying length over the flattened ids: 0, 1 or more ids each
        starts = torch.arange(ids.shape[0]) * (ids.shape[1] // 2)
        return self.head(self.bags(ids.flatten(), starts))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


BAGS: dict[str, Callable[[], Base]] = {
    "sum": lambda: Bags(lambda: nn.EmbeddingBag(20, 8, mode="sum"), offsets=False),
    "mean": lambda: Bags(lambda: nn.EmbeddingBag(20, 8, mode="mean"), offsets=False),
    "max": lambda: Bags(lambda: nn.EmbeddingBag(20, 8, mode="max"), offsets=False),
    "padding-idx": lambda: Bags(lambda: nn.EmbeddingBag(20, 8, mode="mean", padding_idx=4), offsets=False),
    "offsets": lambda: Bags(lambda: nn.EmbeddingBag(20, 8, mode="sum"), offsets=True),
    "scale-grad-by-freq": lambda: Bags(lambda: nn.EmbeddingBag(20, 8, scale_grad_by_freq=True), offsets=False),
}


@pytest.mark.parametrize("make_model", BAGS.values(), ids=BAGS.keys())
def test_embedding_bag_trains_in_ort_like_eager(make_model: Callable[[], Base]) -> None:
    eager, ort = fit_both(make_model, lambda: sequence_batches([(4, 6), (4, 6), (2, 9), (3, 1), (4, 6)], 8), 5)
    assert_ort_ran(ort, 5)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class WeightedBags(Bags):
    """Sum bags with a weight per id."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = (x.abs() * 7).long().clamp(max=19)[..., 0]
        return self.head(self.bags(ids, per_sample_weights=x[..., 1].sigmoid()))


def test_embedding_bag_with_per_sample_weights_falls_back_with_the_reason() -> None:
    """ORT's error named a missing ``bag/Loop`` input."""

    def make_model() -> Base:
        return WeightedBags(lambda: nn.EmbeddingBag(20, 8, mode="sum"), offsets=False)

    eager, ort = fit_both(
        make_model, lambda: sequence_batches([(4, 6), (2, 9)], 8), 2, strategy=ORTStrategy(fullgraph=True)
    )
    (report,) = ort.reports
    assert report.fallback_reason is not None and "per_sample_weights" in report.fallback_reason
    assert "test_layers.py" in report.fallback_reason
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class GroupNormFirst(Base):
    """GroupNorm on an input that needs no gradient: the raw images, or a frozen stem's features."""

    def __init__(self, stem: str, dims: int) -> None:
        super().__init__()
        conv = nn.Conv2d if dims == 2 else nn.Conv1d
        self.stem = conv(3, 4, 3, padding=1) if stem == "frozen-stem" else nn.Identity()
        self.stem.requires_grad_(False)
        self.norm = nn.GroupNorm(2, 4 if stem == "frozen-stem" else 3 + 1)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x) if isinstance(self.stem, nn.Conv1d | nn.Conv2d) else torch.cat([x, x[:, :1]], 1)
        return self.head(F.relu(self.norm(h)).flatten(2).mean(2))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


def raw_inputs(dims: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    sizes = (8, 8)[:dims]
    batches = [(torch.randn(b, 3, *sizes, generator=g), torch.randint(0, 3, (b,), generator=g)) for b in (5, 3, 4)]
    return DataLoader(batches, batch_size=None)


class WeightOnlyGroupNorm(nn.Module):
    """``F.group_norm`` with a learned weight and no bias (ORT's export failed on it; eager's backward
    fails on the reverse, a bias without a weight)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.group_norm(x, 4, weight=self.weight, eps=1e-3)


@pytest.mark.parametrize("channels_last", [True, False], ids=["channels-last", "channels-first"])
def test_group_norm_with_a_weight_and_no_bias(channels_last: bool) -> None:
    eager, ort = fit_both(
        lambda: ImageNet(WeightOnlyGroupNorm()), images, 4, strategy=ORTStrategy(channels_last=channels_last)
    )
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


@pytest.mark.parametrize("channels_last", [True, False], ids=["channels-last", "channels-first"])
@pytest.mark.parametrize("dims", [2, 1], ids=["images", "sequences"])
@pytest.mark.parametrize("stem", ["raw-input", "frozen-stem"])
def test_group_norm_of_an_input_without_gradient(stem: str, dims: int, channels_last: bool) -> None:
    """ORT's gradient of GroupNorm failed on such an input ("Const_0 is not a valid intermediate output"),
    and the channels-last kernel's backward crashed the process (SIGSEGV)."""
    eager, ort = fit_both(
        lambda: GroupNormFirst(stem, dims),
        lambda: raw_inputs(dims),
        3,
        strategy=ORTStrategy(channels_last=channels_last),
    )
    assert_ort_ran(ort, 3)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
