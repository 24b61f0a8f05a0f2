"""One row per operator lightning_ort's C++ defines for ORT's graphs (``lightning_ort::NAME``), with the facts
about it that other places read: the start of one op registry (issue 30).

A row names the C++ file that defines the operator (in ``lightning_ort/engine/csrc``), the module that
exports torch's calls to it (its family), which of its inputs have gradient overloads
(``gradient_overloads.OPERATORS``), its output-shape rule (``shape_inference``), and whether
``channels_last`` may keep channels-last layouts through it. ``tests/test_op_registry.py`` checks the
table against the C++ definitions (drift) and against the places that read it.

Not yet here: the shape rules the families declare themselves (``reductions.REDUCED_DIMS``,
``*.SAME_SHAPE_OPERATORS``, ``sampling.OUTPUT_SHAPES``), the gradient overloads added at registration
(``gradient_overloads.add_operator``), the families' symbolics and ``register()`` calls
(``runtime/hooks.py``), and the list of C++ files the build compiles (``bootstrap/extensions.py``, which
sits below this layer and cannot read it; the drift test compares them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PREFIX = "lightning_ort::"

# Output-shape rules shape_inference knows by these names: the first input's shape, the inputs broadcast,
# and the rules of single operators.
ShapeRule = Literal["same", "broadcast", "linear", "attention", "matmul", "einsum", "rnn_layer"]


@dataclass(frozen=True)
class Operator:
    """One ``lightning_ort::NAME`` operator."""

    name: str  # without the ``lightning_ort::`` prefix
    kernel: str  # the C++ file of lightning_ort/engine/csrc that defines it (and its ``NAME_backward``)
    family: str  # the engine module that exports torch's calls to it, relative to lightning_ort.engine
    gradient_inputs: tuple[str, ...] = ()  # inputs that can need gradients, named as its overloads name them
    shape: ShapeRule | None = None  # its output-shape rule; None: ORT's inference, or the family's own rule
    elementwise: bool = False  # every output element computed from the same element of its inputs

    @property
    def qualified_name(self) -> str:
        """``lightning_ort::NAME``, as ATen nodes of ORT's graph name it."""
        return PREFIX + self.name


_TORCH_KERNELS = "ops.kernels.torch_kernels"
_MATMUL_SOFTMAX = "ops.kernels.matmul_softmax"
_CHANNELS_LAST = "passes.channels_last"
_INPUT_WEIGHT = ("input", "weight")
_INPUT_WEIGHT_BIAS = ("input", "weight", "bias")

OPERATORS: tuple[Operator, ...] = (
    # aten_ops.cc: the heavy layers, run on torch's kernels by op_rewrites
    Operator("convolution", "aten_ops.cc", _TORCH_KERNELS, _INPUT_WEIGHT),
    Operator("convolution_bias", "aten_ops.cc", _TORCH_KERNELS, _INPUT_WEIGHT_BIAS),
    Operator("linear", "aten_ops.cc", _TORCH_KERNELS, _INPUT_WEIGHT, shape="linear"),
    Operator("linear_bias", "aten_ops.cc", _TORCH_KERNELS, _INPUT_WEIGHT_BIAS, shape="linear"),
    Operator("relu", "aten_ops.cc", _TORCH_KERNELS, shape="same", elementwise=True),
    Operator("gelu", "aten_ops.cc", _TORCH_KERNELS, shape="same", elementwise=True),
    Operator("layer_norm", "aten_ops.cc", _TORCH_KERNELS, _INPUT_WEIGHT_BIAS, shape="same"),
    Operator("attention", "aten_ops.cc", _TORCH_KERNELS, ("query", "key", "value", "mask"), shape="attention"),
    Operator("batch_norm", "aten_ops.cc", "ops.kernels.batchnorm", _INPUT_WEIGHT_BIAS, shape="same"),
    Operator("matmul", "aten_ops.cc", _MATMUL_SOFTMAX, ("self", "other"), shape="matmul"),
    Operator("softmax", "aten_ops.cc", _MATMUL_SOFTMAX, shape="same"),
    Operator("masked_fill", "aten_ops.cc", _MATMUL_SOFTMAX),
    # channels_last_ops.cc: the channels-last forms channels_last.py puts in the graph
    Operator("convolution_nhwc", "channels_last_ops.cc", _CHANNELS_LAST, _INPUT_WEIGHT),
    Operator("convolution_bias_nhwc", "channels_last_ops.cc", _CHANNELS_LAST, _INPUT_WEIGHT_BIAS),
    Operator("batch_norm_nhwc", "channels_last_ops.cc", _CHANNELS_LAST, _INPUT_WEIGHT_BIAS),
    Operator("group_norm_nhwc", "channels_last_ops.cc", _CHANNELS_LAST, _INPUT_WEIGHT_BIAS),
    Operator("max_pool2d_nhwc", "channels_last_ops.cc", _CHANNELS_LAST),
    Operator("avg_pool2d_nhwc", "channels_last_ops.cc", _CHANNELS_LAST),
    Operator("adaptive_avg_pool2d_nhwc", "channels_last_ops.cc", _CHANNELS_LAST),
    Operator("upsample_nearest2d_nhwc", "channels_last_ops.cc", _CHANNELS_LAST),
    Operator("upsample_bilinear2d_nhwc", "channels_last_ops.cc", _CHANNELS_LAST),
    # activation_ops.cc
    Operator("hardswish", "activation_ops.cc", "ops.kernels.activations", shape="same", elementwise=True),
    Operator("hardsigmoid", "activation_ops.cc", "ops.kernels.activations", shape="same", elementwise=True),
    Operator("mish", "activation_ops.cc", "ops.kernels.activations", shape="same", elementwise=True),
    Operator("softplus", "activation_ops.cc", "ops.kernels.activations", shape="same", elementwise=True),
    Operator("elu", "activation_ops.cc", "ops.kernels.activations", shape="same", elementwise=True),
    Operator("selu", "activation_ops.cc", "ops.kernels.activations", shape="same", elementwise=True),
    # math_ops.cc
    Operator("pow", "math_ops.cc", "ops.kernels.math_ops", ("self", "exponent"), shape="broadcast"),
    Operator("cumprod", "math_ops.cc", "ops.kernels.math_ops"),
    Operator("threshold", "math_ops.cc", "ops.kernels.math_ops"),
    Operator("zeros_like", "math_ops.cc", "ops.kernels.math_ops"),
    # layer_ops.cc
    Operator("group_norm", "layer_ops.cc", "ops.kernels.layers"),
    Operator("group_norm_affine", "layer_ops.cc", "ops.kernels.layers", _INPUT_WEIGHT_BIAS),
    Operator("instance_norm", "layer_ops.cc", "ops.kernels.layers"),
    Operator("instance_norm_affine", "layer_ops.cc", "ops.kernels.layers", _INPUT_WEIGHT_BIAS),
    Operator("batch_statistics_norm", "layer_ops.cc", "ops.kernels.layers"),
    Operator("batch_statistics_norm_affine", "layer_ops.cc", "ops.kernels.layers", _INPUT_WEIGHT_BIAS),
    Operator("prelu", "layer_ops.cc", "ops.kernels.layers", ("self", "weight")),
    Operator("embedding_bag", "layer_ops.cc", "ops.kernels.layers"),
    # rnn_ops.cc, einsum_ops.cc, distance_ops.cc, sampling_ops.cc
    Operator("rnn_layer", "rnn_ops.cc", "ops.kernels.rnn", ("input", "hx", "weights"), shape="rnn_layer"),
    Operator("einsum", "einsum_ops.cc", "ops.kernels.einsum", shape="einsum"),
    Operator("einsum2", "einsum_ops.cc", "ops.kernels.einsum", ("self", "other"), shape="einsum"),
    Operator("cdist", "distance_ops.cc", "ops.kernels.distances", ("x1", "x2")),
    Operator("pairwise_distance", "distance_ops.cc", "ops.kernels.distances", ("x1", "x2")),
    Operator("cosine_similarity", "distance_ops.cc", "ops.kernels.distances", ("x1", "x2")),
    Operator("grid_sample", "sampling_ops.cc", "ops.kernels.sampling", ("input", "grid")),
    # indexing_ops.cc, reduction_ops.cc, special_ops.cc (their shape rules are their families')
    Operator("diff", "indexing_ops.cc", "ops.kernels.indexing"),
    Operator("take_along_dim", "indexing_ops.cc", "ops.kernels.indexing"),
    Operator("nansum", "reduction_ops.cc", "ops.kernels.reductions"),
    Operator("nanmean", "reduction_ops.cc", "ops.kernels.reductions"),
    Operator("prod", "reduction_ops.cc", "ops.kernels.reductions"),
    Operator("std", "reduction_ops.cc", "ops.kernels.reductions"),
    Operator("vector_norm", "reduction_ops.cc", "ops.kernels.reductions"),
    Operator("mvlgamma", "special_ops.cc", "ops.kernels.special_functions"),
    Operator("polygamma", "special_ops.cc", "ops.kernels.special_functions"),
    # upsample_ops.cc, unbind_ops.cc
    Operator("upsample_nearest", "upsample_ops.cc", "ops.kernels.upsample"),
    Operator("upsample_nearest_exact", "upsample_ops.cc", "ops.kernels.upsample"),
    Operator("upsample_linear", "upsample_ops.cc", "ops.kernels.upsample"),
    Operator("upsample_bicubic", "upsample_ops.cc", "ops.kernels.upsample"),
    Operator("unbind2", "unbind_ops.cc", "passes.unbind"),
    Operator("unbind3", "unbind_ops.cc", "passes.unbind"),
)


def family_operators(family: str) -> tuple[str, ...]:
    """The qualified names of ``family``'s operators, in table order."""
    return tuple(operator.qualified_name for operator in OPERATORS if operator.family == family)


def gradient_inputs() -> dict[str, tuple[str, ...]]:
    """Operator -> its inputs that can need gradients, for those with gradient overloads."""
    return {operator.qualified_name: operator.gradient_inputs for operator in OPERATORS if operator.gradient_inputs}


def shape_rules() -> dict[str, ShapeRule]:
    """Operator -> the name of its output-shape rule, for those with one here."""
    return {operator.qualified_name: operator.shape for operator in OPERATORS if operator.shape is not None}


def elementwise_operators() -> frozenset[str]:
    """The operators computed element by element."""
    return frozenset(operator.qualified_name for operator in OPERATORS if operator.elementwise)


def kernel_files() -> tuple[str, ...]:
    """The C++ files that define the table's operators, in table order (``pooling_ops.cc`` defines only
    gradients of torch's own operators, and ``memory_arena.cc`` the arena's controls: neither is here)."""
    return tuple(dict.fromkeys(operator.kernel for operator in OPERATORS))
