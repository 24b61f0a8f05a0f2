"""One sample per operator of the op registry (``lightning_ort/engine/ops/registry.py``), in the manner of
PyTorch's OpInfo: a tiny module applying the op (learnable parameters where it takes gradients), its inputs,
and the ORT options it needs to be reached. Eager PyTorch running the same module is the reference
(``tests/test_op_table.py``).

Rows are keyed by the operator as ATen nodes of ORT's graph name it (``lightning_ort::NAME`` or torch's
``NAME``). A row says how the operator is reached when it is not torch's call of the same name: the
channels-last forms need a 2-D convolution network (channels_last on, the default), the unbind forms the
packed q/k/v split, ``zeros_like`` only appears in the gradient graph (the zero gradient of ``sign``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

Tensor = torch.Tensor
Shape = tuple[int, ...]
# an input: a shape (standard normal values), or a function making the tensor
Input = Shape | Callable[[], Tensor]


class Apply(nn.Module):
    """``function(*inputs, *parameters)``, with learnable parameters of the given shapes."""

    def __init__(self, function: Callable[..., Tensor], parameters: Sequence[Shape]) -> None:
        super().__init__()
        self.function = function
        self.weights = nn.ParameterList(nn.Parameter(torch.randn(shape)) for shape in parameters)

    def forward(self, *inputs: Tensor) -> Tensor:
        return self.function(*inputs, *self.weights)


@dataclass(frozen=True)
class Sample:
    """How one operator is reached and checked."""

    operator: str
    module: Callable[[], nn.Module]
    inputs: tuple[Input, ...] = ((3, 4),)
    channels_last: bool = True  # ORTRuntimeOptions(channels_last=...): off where a 4-D sample would turn NHWC
    graph: Literal["forward", "gradient"] = "forward"  # the graph that holds the operator's node
    reached_by: str = ""  # how the operator gets into the graph, when not by torch's call of its name
    tolerances: dict[str, float] = field(default_factory=dict)  # for torch.testing.assert_close


def _ours(name: str) -> str:
    return f"lightning_ort::{name}"


def function(
    operator: str, apply: Callable[..., Tensor], parameters: Sequence[Shape] = ((3, 4),), **facts: Any
) -> Sample:
    """A sample applying ``apply(*inputs, *parameters)``; by default one (3, 4) input and parameter."""
    return Sample(operator, lambda: Apply(apply, parameters), **facts)


def unary(name: str, apply: Callable[[Tensor], Tensor], **facts: Any) -> Sample:
    """lightning_ort's ``name`` applied to ``x * weight`` by ``apply``."""
    return function(_ours(name), lambda x, w: apply(x * w), **facts)


def binary(name: str, apply: Callable[[Tensor, Tensor], Tensor], **facts: Any) -> Sample:
    """lightning_ort's ``name`` of two learnt operands, ``apply(x * a, x * b)``."""
    return function(_ours(name), lambda x, a, b: apply(x * a, x * b), ((3, 4), (3, 4)), **facts)


def layer(operator: str, make: Callable[[], nn.Module], *inputs: Input, **facts: Any) -> Sample:
    return Sample(operator, make, tuple(inputs), **facts)


def _positive(h: Tensor) -> Tensor:
    return F.softplus(h) + 0.5


def _unit(h: Tensor) -> Tensor:
    """In (0.1, 0.9)."""
    return 0.1 + 0.8 * torch.sigmoid(h)


def _indices(high: int, *shape: int) -> Callable[[], Tensor]:
    return lambda: torch.randint(0, high, shape)


def _mask() -> Tensor:
    return torch.tensor([[True, False, False, True]] * 3)


class _First(nn.Module):
    """The first output of ``module`` (an RNN's sequence)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: Tensor) -> Tensor:
        return self.module(x)[0]


def _normalized(name: str, normalize: Callable[[Tensor], Tensor]) -> Sample:
    """A normalization without parameters of its own, of ``x * weight``."""
    return function(_ours(name), lambda x, w: normalize(x * w), ((2, 3, 5),), inputs=((2, 3, 5),))


def _conv2d(*after: nn.Module, bias: bool = False) -> Callable[[], nn.Module]:
    return lambda: nn.Sequential(nn.Conv2d(2, 3, 3, padding=1, bias=bias), *after)


_IMAGES: Shape = (2, 2, 4, 4)
_NHWC = "a 2-D convolution network with channels_last on: channels_last.py rewrites the layer after the export"


class _PackedSplit(nn.Module):
    """A packed projection split into ``parts`` as nanoGPT does (``qkv.view(...).permute(...)``, ``qkv[i]``)."""

    def __init__(self, parts: int) -> None:
        super().__init__()
        self.parts = parts
        self.projection = nn.Linear(4, 4 * parts)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        packed = self.projection(x).view(batch, length, self.parts, 2, 2).permute(2, 0, 3, 1, 4)
        product = packed[0]
        for index in range(1, self.parts):
            product = product * packed[index]
        return product


def _attention(x: Tensor, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return F.scaled_dot_product_attention(x * q, x * k, x * v)


def _affine_grid(x: Tensor, theta: Tensor) -> Tensor:
    return x * F.affine_grid(theta, [1, 2, 3, 3], align_corners=False)


SAMPLES: tuple[Sample, ...] = (
    # torch_kernels (op_rewrites): the heavy layers on torch's kernels
    layer(_ours("convolution"), lambda: nn.Conv1d(2, 3, 3, bias=False), (2, 2, 5)),
    layer(_ours("convolution_bias"), lambda: nn.Conv1d(2, 3, 3), (2, 2, 5)),
    layer(_ours("linear"), lambda: nn.Linear(4, 3, bias=False), (2, 4)),
    layer(_ours("linear_bias"), lambda: nn.Linear(4, 3), (2, 4)),
    unary("relu", F.relu),
    unary("gelu", F.gelu),
    layer(_ours("layer_norm"), lambda: nn.LayerNorm(4), (2, 3, 4)),
    function(_ours("attention"), _attention, ((1, 3, 4),) * 3, inputs=((2, 1, 3, 4),)),
    layer(_ours("batch_norm"), lambda: nn.BatchNorm1d(3), (4, 3)),
    # matmul_softmax: attention written out by hand
    function(_ours("matmul"), lambda x, w: x @ w, ((2, 4, 5),), inputs=((2, 3, 4),)),
    unary("softmax", lambda h: torch.softmax(h, -1)),
    function(_ours("masked_fill"), lambda x, mask, w: (x * w).masked_fill(mask, -1.0), inputs=((3, 4), _mask)),
    # channels_last: the NHWC forms
    layer(_ours("convolution_nhwc"), _conv2d(), _IMAGES, reached_by=_NHWC),
    layer(_ours("convolution_bias_nhwc"), _conv2d(bias=True), _IMAGES, reached_by=_NHWC),
    layer(_ours("batch_norm_nhwc"), _conv2d(nn.BatchNorm2d(3)), _IMAGES, reached_by=_NHWC),
    layer(_ours("group_norm_nhwc"), _conv2d(nn.GroupNorm(1, 3)), _IMAGES, reached_by=_NHWC),
    layer(_ours("max_pool2d_nhwc"), _conv2d(nn.MaxPool2d(2)), _IMAGES, reached_by=_NHWC),
    layer(_ours("avg_pool2d_nhwc"), _conv2d(nn.AvgPool2d(2)), _IMAGES, reached_by=_NHWC),
    layer(_ours("adaptive_avg_pool2d_nhwc"), _conv2d(nn.AdaptiveAvgPool2d(3)), _IMAGES, reached_by=_NHWC),
    layer(_ours("upsample_nearest2d_nhwc"), _conv2d(nn.Upsample(scale_factor=2)), _IMAGES, reached_by=_NHWC),
    layer(
        _ours("upsample_bilinear2d_nhwc"),
        _conv2d(nn.Upsample(scale_factor=2, mode="bilinear")),
        _IMAGES,
        reached_by=_NHWC,
    ),
    # activations
    unary("hardswish", F.hardswish),
    unary("hardsigmoid", F.hardsigmoid),
    unary("mish", F.mish),
    unary("softplus", F.softplus),
    unary("elu", F.elu),
    unary("selu", F.selu),
    # math_ops
    unary("pow", lambda h: (torch.sigmoid(h) + 0.5) ** h),
    unary("cumprod", lambda h: torch.cumprod(torch.sigmoid(h) + 0.5, 1)),
    unary("threshold", lambda h: F.threshold(h, 0.1, -0.5)),
    unary("zeros_like", lambda h: h * torch.sign(h), graph="gradient", reached_by="the zero gradient of sign"),
    # layers
    _normalized("group_norm", lambda h: F.group_norm(h, 1)),
    layer(_ours("group_norm_affine"), lambda: nn.GroupNorm(1, 3), (2, 3, 5)),
    _normalized("instance_norm", F.instance_norm),
    layer(_ours("instance_norm_affine"), lambda: nn.InstanceNorm1d(3, affine=True), (2, 3, 5)),
    _normalized("batch_statistics_norm", lambda h: F.batch_norm(h, None, None, training=True)),
    layer(_ours("batch_statistics_norm_affine"), lambda: nn.BatchNorm1d(3, track_running_stats=False), (4, 3)),
    layer(_ours("prelu"), lambda: nn.PReLU(3), (2, 3, 5)),
    layer(_ours("embedding_bag"), lambda: nn.EmbeddingBag(10, 4), _indices(10, 2, 3)),
    # rnn, einsum, distances, sampling, indexing
    layer(_ours("rnn_layer"), lambda: _First(nn.RNN(4, 3)), (5, 2, 4)),
    unary("einsum", lambda h: torch.einsum("ij->j", h)),
    # (an explicit output without an ellipsis is ORT's MatMul)
    function(_ours("einsum2"), lambda x, w: torch.einsum("ij,kj", x, w), ((5, 4),)),
    function(_ours("cdist"), lambda x, a, b: torch.cdist(x * a, b), ((3, 4), (5, 4))),
    function(_ours("pairwise_distance"), lambda x, a, b: F.pairwise_distance(x * a, b), ((3, 4), (3, 4))),
    function(_ours("cosine_similarity"), lambda x, a, b: F.cosine_similarity(x * a, b), ((3, 4), (3, 4))),
    function(
        _ours("grid_sample"),
        lambda x, w, grid: F.grid_sample(x * w, torch.tanh(grid), align_corners=False),
        ((1, 2, 4, 4), (1, 3, 3, 2)),
        inputs=((1, 2, 4, 4),),
        channels_last=False,
    ),
    unary("diff", lambda h: torch.diff(h, dim=-1)),
    function(
        _ours("take_along_dim"),
        lambda x, index, w: torch.take_along_dim(x * w, index, dim=1),
        inputs=((3, 4), _indices(4, 3, 2)),
    ),
    # reductions
    unary("nansum", lambda h: torch.nansum(h, dim=1)),
    unary("nanmean", lambda h: torch.nanmean(h, dim=1, keepdim=True)),
    unary("prod", lambda h: torch.prod(torch.sigmoid(h) + 0.5, dim=1, keepdim=True)),
    unary("std", lambda h: h.std(-1, keepdim=True)),
    unary("vector_norm", lambda h: h.norm(dim=-1)),
    # special_functions: one tensor
    unary("lgamma", lambda h: torch.lgamma(_positive(h))),
    unary("digamma", lambda h: torch.digamma(_positive(h))),
    unary("erfinv", lambda h: torch.erfinv(0.9 * torch.tanh(h))),
    unary("erfc", torch.erfc),
    unary("exp2", lambda h: torch.exp2(h.clamp(max=3))),
    unary("sinc", torch.sinc),
    unary("frac", lambda h: torch.frac(3 * h)),
    unary("deg2rad", torch.deg2rad),
    unary("rad2deg", torch.rad2deg),
    unary("sgn", lambda h: h * torch.sgn(h)),
    unary("i0", torch.i0),
    unary("asinh", torch.asinh),
    unary("acosh", lambda h: torch.acosh(_positive(h) + 1)),
    unary("atanh", lambda h: torch.atanh(0.9 * torch.tanh(h))),
    unary("special_i0e", torch.special.i0e),
    unary("special_i1", torch.special.i1),
    unary("special_i1e", torch.special.i1e),
    unary("special_ndtr", torch.special.ndtr),
    unary("special_ndtri", lambda h: torch.special.ndtri(_unit(h))),
    unary("special_log_ndtr", torch.special.log_ndtr),
    unary("special_entr", lambda h: torch.special.entr(torch.sigmoid(h))),
    unary("special_erfcx", torch.special.erfcx),
    unary("mvlgamma", lambda h: torch.mvlgamma(_positive(h) + 1, p=2)),
    unary("polygamma", lambda h: torch.polygamma(1, _positive(h))),
    # special_functions: two tensors
    binary("atan2", torch.atan2),
    binary("hypot", torch.hypot),
    binary("copysign", torch.copysign),
    binary("xlogy", lambda a, b: torch.xlogy(F.relu(a), torch.sigmoid(b))),
    binary("xlog1py", lambda a, b: torch.special.xlog1py(a, torch.sigmoid(b))),
    binary("logaddexp", torch.logaddexp),
    binary("logaddexp2", torch.logaddexp2),
    binary("fmod", lambda a, b: torch.fmod(3 * a, _positive(b))),
    binary("remainder", lambda a, b: torch.remainder(3 * a, _positive(b))),
    binary("float_power", lambda a, b: torch.float_power(_positive(a), torch.sigmoid(b)).float()),
    # upsample
    unary("upsample_nearest", lambda h: F.interpolate(h[None], scale_factor=2)[0]),
    unary("upsample_nearest_exact", lambda h: F.interpolate(h[None], scale_factor=2, mode="nearest-exact")[0]),
    unary("upsample_linear", lambda h: F.interpolate(h[None], scale_factor=2, mode="linear")[0]),
    function(
        _ours("upsample_bicubic"),
        lambda x, w: F.interpolate(x * w, scale_factor=2, mode="bicubic"),
        ((1, 2, 3, 3),),
        inputs=((1, 2, 3, 3),),
        channels_last=False,
    ),
    # unbind (op_rewrites' pass after the export)
    layer(_ours("unbind2"), lambda: _PackedSplit(2), (2, 3, 4), reached_by="a packed projection split in two"),
    layer(_ours("unbind3"), lambda: _PackedSplit(3), (2, 3, 4), reached_by="a packed q/k/v projection split"),
    # torch's own operators
    function("atan", lambda x, w: torch.atan(x * w)),
    function("expm1", lambda x, w: torch.expm1((x * w).clamp(max=2))),
    function("trunc", lambda x, w: x * w * torch.trunc(3 * x * w)),
    function("logcumsumexp", lambda x, w: torch.logcumsumexp(x * w, 1)),
    function("flip", lambda x, w: (x * w).flip(-1)),
    function("roll", lambda x, w: (x * w).roll(1, -1)),
    function("amax", lambda x, w: (x * w).amax(1, keepdim=True)),
    function("amin", lambda x, w: (x * w).amin(1)),
    function(
        "col2im",
        lambda x, w: F.fold(x * w, output_size=(3, 3), kernel_size=2),
        ((1, 8, 4),),
        inputs=((1, 8, 4),),
    ),
    function("affine_grid_generator", _affine_grid, ((1, 2, 3),), inputs=((1, 3, 3, 2),)),
    function(
        "detach_copy",
        lambda x, w: x * w - (x * w).mean(1, keepdim=True).detach(),
        reached_by="Tensor.detach() (detach.py)",
    ),
)
