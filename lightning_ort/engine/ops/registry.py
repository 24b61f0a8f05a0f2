"""The op registry (issue 30): one row per operator that ATen nodes of ORT's graphs run, with the facts about
it that other places read, and the families that register symbolics and gradients.

A row is one of lightning_ort's C++ operators (``lightning_ort::NAME``) or, flagged ``torch_operator``, one of
torch's own that a family exports as an ATen node (``atan``, ``flip``, ``col2im``, ``detach_copy``). It names
the C++ file that defines the operator (for torch's, the file of its ``lightning_ort::NAME_backward``, if
any), the module that exports torch's calls to it (its family), which of its inputs have gradient overloads
(``gradient_overloads.OPERATORS``), its output-shape rule (a rule's name, or a :class:`Reduction`'s positions;
``shape_inference`` maps them to functions), whether ``channels_last`` may keep channels-last layouts through
it, and whether it stops gradients (``gradient_overloads.STOP_GRADIENT_OPERATORS``). :data:`FAMILIES` lists the
modules whose registering function ``runtime/hooks.py``'s ``install()`` calls, in this order.

``tests/test_op_registry.py`` checks the table against the C++ definitions (drift, X-macros included), the
families against ``install()``, and the places that read it against it; ``tests/test_op_table.py`` runs one
sample of every row through ORT against eager.

Not yet here: the families' symbolics themselves; torch's operators whose ATen nodes carry no fact read
from the table (pooling's, upsampling's, ``logsumexp``, ``repeat_interleave``); and the list of C++ files the
build compiles (``bootstrap/extensions.py``, which sits below this layer and cannot read it; the drift test
compares them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

PREFIX = "lightning_ort::"

# Output-shape rules shape_inference knows by these names: the first input's shape, the inputs broadcast,
# and the rules of single operators (``grid_sample``, ``col2im`` and ``affine_grid``: sampling.py's).
ShapeRule = Literal[
    "same", "broadcast", "linear", "attention", "matmul", "einsum", "rnn_layer", "grid_sample", "col2im", "affine_grid"
]


@dataclass(frozen=True)
class Reduction:
    """The output-shape rule of a reduction over constant dimensions: the positions of its inputs that hold
    the dimensions (none: all of them) and ``keepdim``."""

    dims_at: int
    keep_at: int


@dataclass(frozen=True)
class Operator:
    """One operator of ORT's graphs run by an ATen node: ``lightning_ort::NAME``, or torch's own ``NAME``."""

    name: str  # without the ``lightning_ort::`` prefix
    kernel: str | None  # the C++ file of lightning_ort/engine/csrc that defines it (and its ``NAME_backward``);
    # for torch's operators the file defining its backward ``lightning_ort::NAME_backward``, None for none
    family: str  # the engine module that exports torch's calls to it, relative to lightning_ort.engine
    gradient_inputs: tuple[str, ...] = ()  # inputs that can need gradients, named as its overloads name them
    shape: ShapeRule | Reduction | None = None  # its output-shape rule; None: ORT's inference
    elementwise: bool = False  # every output element computed from the same element of its inputs
    torch_operator: bool = False  # torch's own operator (``flip``), not one of lightning_ort's C++
    stops_gradient: bool = False  # no gradient flows through it (``detach``)

    @property
    def qualified_name(self) -> str:
        """The operator as ATen nodes of ORT's graph name it: ``lightning_ort::NAME``, or torch's ``NAME``."""
        return self.name if self.torch_operator else PREFIX + self.name


def _torch(name: str, kernel: str | None, family: str, shape: ShapeRule | Reduction, **facts: Any) -> Operator:
    """A row for one of torch's own operators, run by an ATen node a family exports."""
    return Operator(name, kernel, family, shape=shape, torch_operator=True, **facts)


_TORCH_KERNELS = "ops.kernels.torch_kernels"
_MATMUL_SOFTMAX = "ops.kernels.matmul_softmax"
_CHANNELS_LAST = "passes.channels_last"
_LAYERS = "ops.kernels.layers"
_MATH = "ops.kernels.math_ops"
_REDUCTIONS = "ops.kernels.reductions"
_SAMPLING = "ops.kernels.sampling"
_SPECIAL = "ops.kernels.special_functions"
_SPECIAL_UNARY = (
    "lgamma", "digamma", "erfinv", "erfc", "exp2", "sinc", "frac", "deg2rad", "rad2deg", "sgn", "i0", "asinh",
    "acosh", "atanh", "special_i0e", "special_i1", "special_i1e", "special_ndtr", "special_ndtri",
    "special_log_ndtr", "special_entr", "special_erfcx",
)  # fmt: skip
_SPECIAL_BINARY = (
    "atan2", "hypot", "copysign", "xlogy", "xlog1py", "logaddexp", "logaddexp2", "fmod", "remainder", "float_power",
)  # fmt: skip
_INPUT_WEIGHT = ("input", "weight")
_INPUT_WEIGHT_BIAS = ("input", "weight", "bias")

OPERATORS: tuple[Operator, ...] = (
    # torch_kernels.cc: the heavy layers, run on torch's kernels by op_rewrites
    Operator("convolution", "torch_kernels.cc", _TORCH_KERNELS, _INPUT_WEIGHT),
    Operator("convolution_bias", "torch_kernels.cc", _TORCH_KERNELS, _INPUT_WEIGHT_BIAS),
    Operator("linear", "torch_kernels.cc", _TORCH_KERNELS, _INPUT_WEIGHT, shape="linear"),
    Operator("linear_bias", "torch_kernels.cc", _TORCH_KERNELS, _INPUT_WEIGHT_BIAS, shape="linear"),
    Operator("relu", "torch_kernels.cc", _TORCH_KERNELS, shape="same", elementwise=True),
    Operator("gelu", "torch_kernels.cc", _TORCH_KERNELS, shape="same", elementwise=True),
    Operator("layer_norm", "torch_kernels.cc", _TORCH_KERNELS, _INPUT_WEIGHT_BIAS, shape="same"),
    Operator("attention", "torch_kernels.cc", _TORCH_KERNELS, ("query", "key", "value", "mask"), shape="attention"),
    Operator("batch_norm", "torch_kernels.cc", "ops.kernels.batchnorm", _INPUT_WEIGHT_BIAS, shape="same"),
    Operator("matmul", "torch_kernels.cc", _MATMUL_SOFTMAX, ("self", "other"), shape="matmul"),
    Operator("softmax", "torch_kernels.cc", _MATMUL_SOFTMAX, shape="same"),
    Operator("masked_fill", "torch_kernels.cc", _MATMUL_SOFTMAX),
    # channels_last.cc: the channels-last forms channels_last.py puts in the graph
    Operator("convolution_nhwc", "channels_last.cc", _CHANNELS_LAST, _INPUT_WEIGHT),
    Operator("convolution_bias_nhwc", "channels_last.cc", _CHANNELS_LAST, _INPUT_WEIGHT_BIAS),
    Operator("batch_norm_nhwc", "channels_last.cc", _CHANNELS_LAST, _INPUT_WEIGHT_BIAS),
    Operator("group_norm_nhwc", "channels_last.cc", _CHANNELS_LAST, _INPUT_WEIGHT_BIAS),
    Operator("max_pool2d_nhwc", "channels_last.cc", _CHANNELS_LAST),
    Operator("avg_pool2d_nhwc", "channels_last.cc", _CHANNELS_LAST),
    Operator("adaptive_avg_pool2d_nhwc", "channels_last.cc", _CHANNELS_LAST),
    Operator("upsample_nearest2d_nhwc", "channels_last.cc", _CHANNELS_LAST),
    Operator("upsample_bilinear2d_nhwc", "channels_last.cc", _CHANNELS_LAST),
    # activations.cc
    Operator("hardswish", "activations.cc", "ops.kernels.activations", shape="same", elementwise=True),
    Operator("hardsigmoid", "activations.cc", "ops.kernels.activations", shape="same", elementwise=True),
    Operator("mish", "activations.cc", "ops.kernels.activations", shape="same", elementwise=True),
    Operator("softplus", "activations.cc", "ops.kernels.activations", shape="same", elementwise=True),
    Operator("elu", "activations.cc", "ops.kernels.activations", shape="same", elementwise=True),
    Operator("selu", "activations.cc", "ops.kernels.activations", shape="same", elementwise=True),
    # math_ops.cc
    Operator("pow", "math_ops.cc", _MATH, ("self", "exponent"), shape="broadcast"),
    Operator("cumprod", "math_ops.cc", "ops.kernels.math_ops", shape="same"),
    Operator("threshold", "math_ops.cc", "ops.kernels.math_ops", shape="same"),
    Operator("zeros_like", "math_ops.cc", _MATH),
    # layers.cc
    Operator("group_norm", "layers.cc", _LAYERS, shape="same"),
    Operator("group_norm_affine", "layers.cc", _LAYERS, _INPUT_WEIGHT_BIAS, shape="same"),
    Operator("instance_norm", "layers.cc", _LAYERS, shape="same"),
    Operator("instance_norm_affine", "layers.cc", _LAYERS, _INPUT_WEIGHT_BIAS, shape="same"),
    Operator("batch_statistics_norm", "layers.cc", _LAYERS, shape="same"),
    Operator("batch_statistics_norm_affine", "layers.cc", _LAYERS, _INPUT_WEIGHT_BIAS, shape="same"),
    Operator("prelu", "layers.cc", _LAYERS, ("self", "weight"), shape="same"),
    Operator("embedding_bag", "layers.cc", _LAYERS),
    # rnn.cc, einsum.cc, distances.cc, sampling.cc
    Operator("rnn_layer", "rnn.cc", "ops.kernels.rnn", ("input", "hx", "weights"), shape="rnn_layer"),
    Operator("einsum", "einsum.cc", "ops.kernels.einsum", shape="einsum"),
    Operator("einsum2", "einsum.cc", "ops.kernels.einsum", ("self", "other"), shape="einsum"),
    Operator("cdist", "distances.cc", "ops.kernels.distances", ("x1", "x2")),
    Operator("pairwise_distance", "distances.cc", "ops.kernels.distances", ("x1", "x2")),
    Operator("cosine_similarity", "distances.cc", "ops.kernels.distances", ("x1", "x2")),
    Operator("grid_sample", "sampling.cc", _SAMPLING, ("input", "grid"), shape="grid_sample"),
    # indexing.cc, reductions.cc (the positions of a reduction's dimensions and keepdim inputs)
    Operator("diff", "indexing.cc", "ops.kernels.indexing"),
    Operator("take_along_dim", "indexing.cc", "ops.kernels.indexing"),
    Operator("nansum", "reductions.cc", _REDUCTIONS, shape=Reduction(1, 2)),
    Operator("nanmean", "reductions.cc", _REDUCTIONS, shape=Reduction(1, 2)),
    Operator("prod", "reductions.cc", _REDUCTIONS, shape=Reduction(1, 2)),
    Operator("std", "reductions.cc", _REDUCTIONS, shape=Reduction(1, 3)),
    Operator("vector_norm", "reductions.cc", _REDUCTIONS, shape=Reduction(2, 3)),
    # special_functions.cc: functions of one tensor (its X-macro UNARY_FUNCTIONS, and two with an integer parameter)
    *(Operator(name, "special_functions.cc", _SPECIAL, shape="same") for name in _SPECIAL_UNARY),
    Operator("mvlgamma", "special_functions.cc", _SPECIAL, shape="same"),
    Operator("polygamma", "special_functions.cc", _SPECIAL, shape="same"),
    # ... and of two tensors that broadcast (BINARY_FUNCTIONS), with one overload per set of gradients
    *(
        Operator(name, "special_functions.cc", _SPECIAL, ("self", "other"), shape="broadcast")
        for name in _SPECIAL_BINARY
    ),
    # upsample.cc, unbind.cc
    Operator("upsample_nearest", "upsample.cc", "ops.kernels.upsample"),
    Operator("upsample_nearest_exact", "upsample.cc", "ops.kernels.upsample"),
    Operator("upsample_linear", "upsample.cc", "ops.kernels.upsample"),
    Operator("upsample_bicubic", "upsample.cc", "ops.kernels.upsample"),
    Operator("unbind2", "unbind.cc", "passes.unbind"),
    Operator("unbind3", "unbind.cc", "passes.unbind"),
    # torch's own operators that families export as ATen nodes, with the facts read about them
    _torch("atan", "math_ops.cc", _MATH, "same"),
    _torch("expm1", "math_ops.cc", _MATH, "same"),
    _torch("trunc", None, _MATH, "same"),  # its gradient is zero (zeros_like)
    _torch("logcumsumexp", "math_ops.cc", _MATH, "same"),
    _torch("flip", None, "ops.kernels.indexing", "same"),  # gradients: ONNX nodes
    _torch("roll", None, "ops.kernels.indexing", "same"),
    _torch("amax", "reductions.cc", _REDUCTIONS, Reduction(1, 2)),
    _torch("amin", "reductions.cc", _REDUCTIONS, Reduction(1, 2)),
    _torch("col2im", None, _SAMPLING, "col2im"),  # gradient: torch's im2col
    _torch("affine_grid_generator", None, _SAMPLING, "affine_grid"),  # torch's affine_grid_generator_backward
    # a fresh symbol for a kept dimension of 1 (RevIN's x.mean(1, keepdim=True).detach()) was merged with the
    # dimensions it broadcasts against, a graph input's length with a number: the graph then read that
    # input's length as the number
    _torch("detach_copy", None, "ops.symbolics.detach", "same", stops_gradient=True),
)


def family_operators(family: str) -> tuple[str, ...]:
    """The qualified names of ``family``'s operators, in table order."""
    return tuple(operator.qualified_name for operator in OPERATORS if operator.family == family)


def gradient_inputs() -> dict[str, tuple[str, ...]]:
    """Operator -> its inputs that can need gradients, for those with gradient overloads."""
    return {operator.qualified_name: operator.gradient_inputs for operator in OPERATORS if operator.gradient_inputs}


def shape_rules() -> dict[str, ShapeRule | Reduction]:
    """Operator -> its output-shape rule (a rule's name, or a reduction's positions), for those with one."""
    return {operator.qualified_name: operator.shape for operator in OPERATORS if operator.shape is not None}


def elementwise_operators() -> frozenset[str]:
    """The operators computed element by element."""
    return frozenset(operator.qualified_name for operator in OPERATORS if operator.elementwise)


def stop_gradient_operators() -> frozenset[str]:
    """The operators no gradient flows through."""
    return frozenset(operator.qualified_name for operator in OPERATORS if operator.stops_gradient)


def kernel_files() -> tuple[str, ...]:
    """The C++ files that define the table's operators, in table order (``pooling.cc`` defines only
    gradients of torch's own operators, and ``memory_arena.cc`` the arena's controls: neither is here)."""
    kernels = (operator.kernel for operator in OPERATORS if operator.kernel is not None and not operator.torch_operator)
    return tuple(dict.fromkeys(kernels))


# The modules that register symbolics and gradients with ORT's registries, relative to lightning_ort.engine,
# and the function each is registered by, in the order ``runtime/patches.py``'s ``install()`` calls them (a
# later registration of the same torch operator wins).
FAMILIES: tuple[tuple[str, str], ...] = (
    ("ops.symbolics.attention", "register"),
    ("ops.kernels.activations", "register"),
    ("ops.kernels.pad_shuffle", "register"),
    ("ops.kernels.math_ops", "register"),
    ("ops.kernels.special_functions", "register"),
    ("ops.symbolics.matrix_transposes", "register"),
    ("ops.symbolics.losses", "register"),
    ("ops.symbolics.regression_losses", "register"),
    ("ops.kernels.layers", "register"),
    ("ops.kernels.indexing", "register"),
    ("ops.kernels.distances", "register"),
    ("ops.symbolics.random_ops", "register"),
    ("ops.symbolics.feature_dropout", "register"),
    ("ops.kernels.sampling", "register"),
    ("ops.kernels.pooling", "register"),
    ("ops.kernels.reductions", "register"),
    ("ops.kernels.rnn", "register"),
    ("ops.symbolics.rnn_dropout", "register"),
    ("ops.symbolics.chunks", "register"),
    ("ops.symbolics.unflatten", "register"),
    ("ops.kernels.einsum", "register"),
    ("ops.symbolics.onnx_gradients", "register"),
    ("passes.channels_last", "register_gradients"),
    ("ops.kernels.batchnorm", "register"),
    ("ops.symbolics.conv_padding", "register"),
    ("ops.symbolics.detach", "register"),
    ("ops.symbolics.split_gradients", "register"),
    ("ops.kernels.op_rewrites", "register_gradients"),
    ("passes.unbind", "register_gradients"),
    ("ops.kernels.upsample", "register"),
)
