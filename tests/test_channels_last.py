"""channels_last: 2-D convolution networks train in ORT on (N, H, W, C) activations.

The reference is eager PyTorch on the same model in ``torch.channels_last`` memory, which runs the
kernels ORT's graph then runs: the forward pass is equal to the bit, and training stays within float
rounding (ORT's own element-wise kernels, and a gradient that reaches a layer in the other memory
layout, round differently). Against eager in standard memory results differ by float rounding only;
without ``channels_last`` they are equal to the bit.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import lightning as L
import onnx
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base
from torch import nn
from torch.utils.data import DataLoader

import lightning_ort
from lightning_ort import engine
from lightning_ort.engine.bootstrap.extensions import load_aten_ops
from lightning_ort.engine.passes.channels_last import to_channels_last

STEPS = 6


class ChannelsLastNet(Base):
    """Takes its images in channels-last memory (eagerly; ORT's graph has no memory formats)."""

    def __init__(self, body: nn.Module, features: int, memory_format: torch.memory_format) -> None:
        super().__init__()
        self.memory_format = memory_format
        self.body = body.to(memory_format=memory_format)
        self.head = nn.Linear(features, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.body(x.contiguous(memory_format=self.memory_format)), 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", F.cross_entropy(self(batch[0]), batch[1]))


class Residual(nn.Module):
    """A ResNet basic block with a squeeze-and-excitation gate: additions and a broadcast product."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)
        self.bn2 = nn.BatchNorm2d(channels, momentum=0.3)
        self.gate = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(channels, channels, 1), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(x + out * self.gate(out))


def resnet_like() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        Residual(8),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 1, bias=False),
        nn.GELU(),
        nn.AvgPool2d(2),
        nn.ConvTranspose2d(8, 8, 2, stride=2),
        nn.LeakyReLU(0.1),
        nn.AdaptiveAvgPool2d(2),
    )


def torch_kernels_only() -> nn.Module:
    """Layers that all run torch's kernels inside ORT's graph."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, groups=2, bias=False),
        nn.BatchNorm2d(8, momentum=0.3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.AvgPool2d(2, stride=1),
        nn.ConvTranspose2d(8, 8, 2, stride=2, bias=False),
        nn.GELU(),
        nn.AdaptiveAvgPool2d(2),
    )


class TinyUNet(nn.Module):
    """A U-Net level: a skip connection concatenated (channels) with the upsampled deeper features."""

    def __init__(self, mode: str = "nearest") -> None:
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.deeper = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.up = nn.Upsample(scale_factor=2, mode=mode)
        self.merge = nn.Sequential(nn.Conv2d(24, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.down(x)
        return self.merge(torch.cat([self.up(self.deeper(skip)), skip], dim=1))


class ConvNeXtBlock(nn.Module):
    """ConvNeXt's block: a depthwise convolution, then LayerNorm and linear layers on ``permute(0, 2, 3, 1)``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.norm = nn.LayerNorm(channels)
        self.expand, self.project = nn.Linear(channels, 4 * channels), nn.Linear(4 * channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.depthwise(x).permute(0, 2, 3, 1))
        return x + self.project(F.gelu(self.expand(y))).permute(0, 3, 1, 2)


def convnext_like() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 2, stride=2), ConvNeXtBlock(8), ConvNeXtBlock(8), nn.AdaptiveAvgPool2d(2))


class GroupNormBlock(nn.Module):
    """A diffusion U-Net's residual block: GroupNorm, SiLU and convolutions."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.GroupNorm(2, channels),
            nn.SiLU(),
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.GroupNorm(4, channels),
            nn.SiLU(),
            nn.Conv2d(channels, channels, 3, padding=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.layers(x)


def group_norm_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), GroupNormBlock(8), nn.AdaptiveAvgPool2d(2))


def frozen_stem() -> nn.Module:
    body = resnet_like()
    body[0].requires_grad_(False)
    body[1].requires_grad_(False)
    return body


def image_loader(sizes: tuple[int, ...] = (12,)) -> DataLoader:
    """Batches of 8 images; with several sizes, batch i has images of sizes[i % len(sizes)]."""
    g = torch.Generator().manual_seed(0)
    batches = []
    for i in range(8):
        size = sizes[i % len(sizes)]
        batches.append((torch.randn(8, 3, size, size, generator=g), torch.randint(0, 4, (8,), generator=g)))
    return DataLoader(batches, batch_size=None)


class Recorder(L.Callback):
    """The graph ORT differentiated for the LightningModule's forward, by operator, and every image size
    trained on while that graph stayed the same export."""

    def __init__(self) -> None:
        self.operators: Counter[str] = Counter()
        self.exports: list[onnx.ModelProto] = []
        self.sizes: set[tuple[int, ...]] = set()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not isinstance(trainer.strategy, lightning_ort.ORTStrategy):
            return
        ort_module = trainer.strategy.ort_modules["forward"]
        if not self.operators:
            model = engine.processed_model(ort_module, training=True)
            self.operators = Counter(_operator(node) or node.op_type for node in model.graph.node)
        export = engine.exported_model(ort_module, training=True)
        if not any(export is seen for seen in self.exports):
            self.exports.append(export)
        self.sizes.add(tuple(batch[0].shape[2:]))


def _operator(node: onnx.NodeProto) -> str:
    return next((attribute.s.decode() for attribute in node.attribute if attribute.name == "operator"), "")


def _fit(
    make_body: Any, memory_format: torch.memory_format, loader: Any = image_loader, **strategy: Any
) -> tuple[Any, Any, Recorder]:
    recorder = Recorder()

    def make_model() -> ChannelsLastNet:
        return ChannelsLastNet(make_body(), 8 * 2 * 2, memory_format)

    eager, ort = fit_both(
        make_model,
        loader,
        STEPS,
        strategy=lightning_ort.ORTStrategy(**strategy),
        callbacks=[recorder],
        val=loader(),
        val_check_interval=3,
    )
    assert_ort_ran(ort, STEPS)
    return eager, ort, recorder


CNN_LAYERS = ["convolution", "convolution_bias", "batch_norm", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"]
UNET_LAYERS = ["convolution", "convolution_bias", "batch_norm", "max_pool2d", "upsample_nearest2d"]
BILINEAR_UNET_LAYERS = ["convolution", "convolution_bias", "batch_norm", "max_pool2d", "upsample_bilinear2d"]
CONVNEXT_LAYERS = ["convolution_bias", "adaptive_avg_pool2d"]
GROUP_NORM_LAYERS = ["convolution_bias", "group_norm", "adaptive_avg_pool2d"]


@pytest.mark.parametrize(
    ("make_body", "layers"),
    [
        (torch_kernels_only, CNN_LAYERS),
        (resnet_like, CNN_LAYERS),
        (frozen_stem, CNN_LAYERS),
        (TinyUNet, UNET_LAYERS),
        (lambda: TinyUNet("bilinear"), BILINEAR_UNET_LAYERS),
        (convnext_like, CONVNEXT_LAYERS),
        (group_norm_net, GROUP_NORM_LAYERS),
    ],
    ids=["torch-kernels", "resnet-like", "frozen-stem", "u-net", "bilinear-u-net", "convnext", "group-norm"],
)
def test_channels_last_trains_like_eager_in_channels_last_memory(make_body: Any, layers: list[str]) -> None:
    eager, ort, recorder = _fit(make_body, torch.channels_last)
    assert eager.losses[0] == ort.losses[0]
    assert_losses_match(eager, ort, rtol=1e-6)
    assert_states_match(eager, ort, atol=1e-6, rtol=1e-5)
    operators = recorder.operators
    for layer in layers:
        assert operators[f"lightning_ort::{layer}_nhwc"] >= 1, layer
    assert operators["lightning_ort::convolution"] == operators["lightning_ort::batch_norm"] == 0
    # into the layout at the input, back to the standard one before flatten: nothing in between (the
    # ConvNeXt blocks' own permutes between the layouts are absorbed)
    assert operators["Transpose"] == 2


@pytest.mark.parametrize("make_body", [resnet_like, TinyUNet], ids=["resnet-like", "u-net"])
def test_channels_last_follows_varying_image_sizes(make_body: Any) -> None:
    eager, ort, recorder = _fit(make_body, torch.channels_last, lambda: image_loader((12, 8, 16)))
    assert_losses_match(eager, ort, rtol=1e-6)
    assert_states_match(eager, ort, atol=1e-6, rtol=1e-5)
    assert recorder.sizes == {(12, 12), (8, 8), (16, 16)} and len(recorder.exports) == 1


def test_standard_memory_matches_eager_at_float_tolerance_and_exactly_without_channels_last() -> None:
    eager, ort, recorder = _fit(resnet_like, torch.contiguous_format)
    assert recorder.operators["lightning_ort::convolution_nhwc"] == 3
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    eager, ort, recorder = _fit(torch_kernels_only, torch.contiguous_format, channels_last=False)
    operators = recorder.operators
    assert operators["lightning_ort::convolution"] == 2 and operators["Transpose"] == 0
    assert_losses_match(eager, ort, rtol=0)
    assert_states_match(eager, ort, atol=0, rtol=0)


class LeavesTheLayout(Base):
    """Feature maps that leave the channels-last region: a per-column bias (broadcast over the width, which
    the region cannot hold), graph outputs (one permuted to (N, H, W, C) by the user) and a tensor read
    twice."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.column_bias = nn.Parameter(torch.linspace(-1, 1, 12))
        self.conv2 = nn.Conv2d(6, 4, 3, padding=1)
        self.head = nn.Linear(4 * 6 * 6, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = F.relu(self.bn(self.conv(x)))
        shifted = features + self.column_bias
        out = F.max_pool2d(self.conv2(shifted) + features[:, :4], 2)
        return self.head(out.flatten(1)), features, features.permute(0, 2, 3, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits, features, channels_last = self(batch[0])
        weights = torch.linspace(0, 1, channels_last.shape[-1])
        return F.cross_entropy(logits, batch[1]) + features.square().mean() + (channels_last * weights).mean()


def test_tensors_leaving_the_layout_match_eager() -> None:
    eager, ort = fit_both(LeavesTheLayout, image_loader, STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class ReadAcrossTheLayout(Base):
    """A graph input read by a convolution and by another node, and channel slices of feature maps (a CIFAR
    ResNet's "option A" shortcut): the first defined the input twice, the others had ORT's compute optimizer
    fail on the slices' unknown dimensions ("Invalid dim found in CreateNewShapeWithUpdatedDim"), so both
    fell back to PyTorch with the default options."""

    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = pattern
        self.stem, self.down = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 8, 3, 2, 1)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.stem(x))
        if self.pattern == "input-read-again":
            return self.head(torch.cat([h.mean((2, 3)), x.mean((2, 3)), x.amax((2, 3)).sigmoid()], 1)[:, :8])
        if self.pattern == "option-a-shortcut":
            shortcut = F.pad(h[:, :, ::2, ::2], (0, 0, 0, 0, 2, 2))
            return self.head(F.relu(self.down(h) + shortcut).mean((2, 3)))
        sliced = torch.cat([h[:, :2] + x[:, :2], self.stem(h[:, :3])[:, 1:] + h[:, 1:]], 1)  # "channel-slices"
        return self.head(sliced.mean((2, 3)).repeat(1, 2)[:, :8])

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


@pytest.mark.parametrize("pattern", ["input-read-again", "option-a-shortcut", "channel-slices"])
def test_tensors_read_across_the_layout_train_in_ort(pattern: str) -> None:
    eager, ort = fit_both(lambda: ReadAcrossTheLayout(pattern), image_loader, 3)
    assert_ort_ran(ort, 3)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def _conv_relu_graph(bias_shape: list[int]) -> onnx.ModelProto:
    helper = onnx.helper
    conv = helper.make_node("ATen", ["x", "w"], ["y"], domain="org.pytorch.aten", operator="lightning_ort::convolution")
    nodes = [conv, helper.make_node("Relu", ["y"], ["r"]), helper.make_node("Add", ["r", "b"], ["out"])]
    float_type = onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", float_type, ["batch", 3, 8, 8]),
            helper.make_tensor_value_info("w", float_type, [4, 3, 3, 3]),
            helper.make_tensor_value_info("b", float_type, bias_shape),
        ],
        [helper.make_tensor_value_info("out", float_type, None)],
        value_info=[
            helper.make_tensor_value_info("y", float_type, ["batch", 4, 6, 6]),
            helper.make_tensor_value_info("r", float_type, ["batch", 4, 6, 6]),
        ],
    )
    return helper.make_model(graph)


@pytest.mark.parametrize(
    ("bias_shape", "adds_in_nhwc"), [([1], True), ([1, 4, 1, 1], True), ([6], False)], ids=["scalar", "4d", "row"]
)
def test_rewrite_keeps_broadcasting_meaning_and_is_idempotent(bias_shape: list[int], adds_in_nhwc: bool) -> None:
    model = _conv_relu_graph(bias_shape)
    assert to_channels_last(model) == 1
    nodes = [(node.op_type, list(node.input), list(node.output)) for node in model.graph.node]
    add = next(node for node in nodes if node[0] == "Add")
    # an [N, C, 1, 1] operand is transposed with the feature map; a [W] one makes the map go back first
    assert add[1][0].endswith("_nhwc") is adds_in_nhwc
    assert add[1][1].endswith("_nhwc") is (adds_in_nhwc and len(bias_shape) == 4)
    assert add[2] == ["out_nhwc"] if adds_in_nhwc else add[2] == ["out"]
    shapes = {info.name: [d.dim_param or d.dim_value for d in info.type.tensor_type.shape.dim] for info in
              model.graph.value_info}  # fmt: skip
    assert shapes["y_nhwc"] == ["batch", 6, 6, 4] and "y" not in shapes
    assert model.graph.node[-1].output == ["out"]  # graph outputs keep their name and layout
    again = onnx.ModelProto()
    again.CopyFrom(model)
    assert to_channels_last(again) == 0 and again == model


def test_graph_without_convolutions_is_left_as_it_is() -> None:
    """A permute into (N, C, H, W) followed by element-wise nodes, in a graph with nothing to convert."""
    helper, float_type = onnx.helper, onnx.TensorProto.FLOAT
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]),
        helper.make_node("Relu", ["t"], ["r"]),
        helper.make_node("ReduceSum", ["r"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", float_type, ["batch", 4, 4, 3])],
        [helper.make_tensor_value_info("out", float_type, None)],
        value_info=[helper.make_tensor_value_info(name, float_type, ["batch", 3, 4, 4]) for name in ("t", "r")],
    )
    model = helper.make_model(graph)
    before = onnx.ModelProto()
    before.CopyFrom(model)
    assert to_channels_last(model) == 0 and model == before


def test_channels_last_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match=r"ORTStrategy\(channels_last='yes'\) must be True or False"):
        lightning_ort.ORTStrategy(channels_last="yes")  # type: ignore[arg-type]


def downsampling_shortcut() -> nn.Module:
    """ResNet's downsampling shortcut: a 1x1 convolution with stride 2 whose input needs a gradient."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 1, stride=2), nn.AdaptiveAvgPool2d(2)
    )


@pytest.mark.parametrize("size", [8, 12])
def test_strided_pointwise_convolution_stays_in_the_standard_layout(size: int) -> None:
    """torch's channels-last backward of it corrupted the heap on even image sizes (SIGSEGV, or glibc's
    "corrupted size vs. prev_size" when the process ended)."""
    eager, ort, recorder = _fit(downsampling_shortcut, torch.contiguous_format, lambda: image_loader((size,)))
    assert_losses_match(eager, ort, rtol=1e-6)
    assert_states_match(eager, ort, atol=1e-6, rtol=1e-5)
    assert recorder.operators["lightning_ort::convolution_bias_nhwc"] == 1
    assert recorder.operators["lightning_ort::convolution_bias"] == 1


class LastStage(nn.Module):
    """A ResNet's last stage on small images: 256 channels at 2x2, a weight much larger than its activations."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.widen = nn.Conv2d(16, 128, 3, stride=2, padding=1, bias=False)
        self.last = nn.Conv2d(128, 256, 3, stride=2, padding=1, bias=False)  # 294,912 weights, 2x2 outputs
        self.bn = nn.BatchNorm2d(256)
        self.pool = nn.AdaptiveAvgPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.widen(self.stem(x))
        # eager's reference: this layer in standard memory (its weight too), as ORT's graph runs it
        standard = F.conv2d(x.contiguous(), self.last.weight.contiguous(), stride=2, padding=1)
        channels_last = x.is_contiguous(memory_format=torch.channels_last)
        standard = standard.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        return self.pool(F.relu(self.bn(standard)))[:, :8]


def test_convolution_with_a_weight_larger_than_its_activations_runs_in_standard_memory() -> None:
    """torch's channels-last kernels lose to the standard ones there (ResNet's last stages on small images:
    1.3-2.2x slower, NOTES 61): the layer computes in standard memory, exactly as eager does for a model in
    standard memory, and the layers around it stay channels-last."""
    load_aten_ops()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 128, 4, 4, generator=g)
    weight = torch.randn(256, 128, 3, 3, generator=g) * 0.03
    grad = torch.randn(8, 256, 2, 2, generator=g)
    layout = ([2, 2], [1, 1], [1, 1], False, [0, 0], 1)
    nhwc = x.permute(0, 2, 3, 1).contiguous()
    output = torch.ops.lightning_ort.convolution_nhwc(nhwc, weight, *layout)
    grad_input, grad_weight, _ = torch.ops.lightning_ort.convolution_nhwc_backward(
        grad.permute(0, 2, 3, 1).contiguous(), nhwc, weight, None, *layout
    )
    expected = torch.ops.aten.convolution(x, weight, None, *layout)
    expected_input, expected_weight, _ = torch.ops.aten.convolution_backward(
        grad, x, weight, None, *layout, [True, True, False]
    )
    # (on a CPU whose channels-last and standard kernels round alike the check below cannot tell the layouts
    # apart; it still holds)
    assert torch.equal(output.permute(0, 3, 1, 2), expected)
    assert torch.equal(grad_input.permute(0, 3, 1, 2), expected_input)
    assert torch.equal(grad_weight, expected_weight)


def test_last_stage_on_small_images_trains_like_eager() -> None:
    eager, ort, recorder = _fit(LastStage, torch.channels_last, lambda: image_loader((16,)))
    assert_losses_match(eager, ort, rtol=1e-6)
    assert_states_match(eager, ort, atol=1e-6, rtol=1e-5)
    assert recorder.operators["lightning_ort::convolution_nhwc"] == 2
