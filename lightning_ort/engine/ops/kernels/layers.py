"""Layers ORT could not train, on torch's kernels inside ORT's graph.

- ``nn.PReLU``: ORT 1.19.2 has no gradient for ``PRelu``;
- ``nn.InstanceNorm*`` without running statistics (the default): none for ``InstanceNormalization``;
- ``nn.BatchNorm*`` with ``track_running_stats=False``: the exporter cannot export it with sizes
  it does not know;
- ``F.adaptive_max_pool1d/2d/3d``: torch exports them only when the sizes divide evenly, as
  ``MaxPool``, and not at all otherwise;
- ``nn.EmbeddingBag``: exported as an ONNX ``Loop`` whose gradient ORT cannot build;
- ``nn.GroupNorm(affine=False)``, and ``F.group_norm`` with a weight but no bias: exported as
  ``InstanceNormalization`` (ORT's own export handles only the affine form);
- ``nn.GroupNorm`` whose input needs no gradient (a first layer, after a frozen stem): ORT's
  gradient of its ``native_group_norm`` failed ("Const_0 is not a valid intermediate output").

Models with them fell back to PyTorch. They are exported as ATen nodes running torch's operators,
and their gradients are eager autograd's (``csrc/layers.cc``; adaptive max pooling uses torch's
own backward operator), whatever ``op_rewrites`` says. InstanceNorm with running statistics and
EmbeddingBag with sparse gradients or per-sample weights keep torch's export (and fall back).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import _type_utils, symbolic_helper, symbolic_opset9, symbolic_opset11

from lightning_ort.engine.ops.kernels.gradient_overloads import register_gradient, register_simple_gradient
from lightning_ort.engine.ops.kernels.torch_kernels import ATEN, aten_like, constant

GROUP_NORM_AFFINE = "lightning_ort::group_norm_affine"


def _prelu(g: Any, self: Any, weight: Any) -> Any:
    return aten_like(g, "lightning_ort::prelu", self, weight)


def _instance_norm(
    g: Any,
    input: Any,
    weight: Any,
    bias: Any,
    running_mean: Any,
    running_var: Any,
    use_input_stats: Any,
    momentum: Any,
    eps: Any,
    cudnn_enabled: Any,
) -> Any:
    use_input = symbolic_helper._maybe_get_const(use_input_stats, "b")
    affine = not symbolic_helper._is_none(weight) and not symbolic_helper._is_none(bias)
    plain = symbolic_helper._is_none(weight) and symbolic_helper._is_none(bias)
    stats = not symbolic_helper._is_none(running_mean) or not symbolic_helper._is_none(running_var)
    if stats or use_input is not True or not (affine or plain):
        return symbolic_opset9.instance_norm(
            g, input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps, cudnn_enabled
        )
    return _batch_statistics(g, "instance_norm", input, weight, bias, eps)


def batch_statistics_norm(g: Any, input: Any, weight: Any, bias: Any, eps: Any) -> Any | None:
    """BatchNorm without running statistics (``track_running_stats=False``: batch statistics in
    every mode) as lightning_ort's operator, or None when only one of weight and bias is given."""
    if symbolic_helper._is_none(weight) != symbolic_helper._is_none(bias):
        return None
    return _batch_statistics(g, "batch_statistics_norm", input, weight, bias, eps)


def _batch_statistics(g: Any, name: str, input: Any, weight: Any, bias: Any, eps: Any) -> Any:
    epsilon = constant(g, float(symbolic_helper._get_const(eps, "f", "eps")), torch.float32)
    if symbolic_helper._is_none(weight):
        return aten_like(g, f"lightning_ort::{name}", input, epsilon)
    return aten_like(g, f"lightning_ort::{name}_affine", input, weight, bias, epsilon)


def _adaptive_max_pool(dims: int) -> Any:
    def symbolic(g: Any, input: Any, output_size: Any) -> Any:
        sizes = symbolic_helper._maybe_get_const(output_size, "is")
        if symbolic_helper._is_value(sizes) or len(sizes) != dims:
            return symbolic_helper._unimplemented(f"adaptive_max_pool{dims}d", "output size not constant", input)
        if dims == 1:  # as torch computes it: 2-D pooling over an inserted height of 1
            input = symbolic_helper._unsqueeze_helper(g, input, [-2])
            sizes = [1, *sizes]
        operator = f"adaptive_max_pool{max(dims, 2)}d"
        output, indices = g.op(ATEN, input, constant(g, sizes, torch.int64), operator_s=operator, outputs=2)
        rank = symbolic_helper._get_tensor_rank(input)
        if rank is not None:
            output.setType(input.type().with_sizes([None] * rank))
            indices.setType(input.type().with_dtype(torch.int64).with_sizes([None] * rank))
        if dims == 1:
            output, indices = (symbolic_helper._squeeze_helper(g, value, [-2]) for value in (output, indices))
        return output, indices

    return symbolic


def filled_like(g: Any, value: Any, fill: float) -> Any:
    """A tensor of ``value``'s shape and type holding ``fill``, needing no gradient.

    ``F.group_norm`` with a weight but no bias is the affine form with zeros in its place (and the
    reverse, which eager's backward cannot run, with ones): torch's kernel computes the same values.
    BatchNorm without affine parameters takes them of its running statistics' size (batchnorm.py).
    """
    scalar = _type_utils.JitScalarType.from_value(value, _type_utils.JitScalarType.FLOAT)
    filled = g.op("ConstantOfShape", g.op("Shape", value), value_t=torch.tensor([fill], dtype=scalar.dtype()))
    filled.setType(value.type())
    return filled


def _group_norm(ort_export: Any) -> Any:
    def symbolic(g: Any, input: Any, num_groups: Any, weight: Any, bias: Any, eps: Any, cudnn_enabled: Any) -> Any:
        groups = symbolic_helper._maybe_get_const(num_groups, "i")
        epsilon = symbolic_helper._maybe_get_const(eps, "f")
        if symbolic_helper._is_value(groups) or symbolic_helper._is_value(epsilon):
            return ort_export(g, input, num_groups, weight, bias, eps, cudnn_enabled)
        if symbolic_helper._is_none(weight) and symbolic_helper._is_none(bias):
            arguments = (constant(g, int(groups), torch.int64), constant(g, float(epsilon), torch.float32))
            return aten_like(g, "lightning_ort::group_norm", input, *arguments)
        if symbolic_helper._is_none(weight):
            weight = filled_like(g, bias, 1.0)
        elif symbolic_helper._is_none(bias):
            bias = filled_like(g, weight, 0.0)
        # ORT's arguments for native_group_norm, on lightning_ort's operator
        shape = g.op("Shape", input)
        batch, channels = (g.op("Gather", shape, constant(g, index, torch.int64), axis_i=0) for index in (0, 1))
        positions = g.op("Div", g.op("Size", input), g.op("Mul", batch, channels))
        arguments = (batch, channels, positions, constant(g, int(groups), torch.int64))
        output = g.op(ATEN, input, weight, bias, *arguments, constant(g, float(epsilon), torch.float32),
                      operator_s=GROUP_NORM_AFFINE, outputs=3)[0]  # fmt: skip
        output.setType(input.type())
        return output

    return symbolic


def _embedding_bag(
    g: Any,
    weight: Any,
    indices: Any,
    offsets: Any,
    scale_grad_by_freq: Any,
    mode: Any,
    sparse: Any,
    per_sample_weights: Any,
    include_last_offset: Any,
    padding_idx: Any = None,
) -> Any:
    flags = [symbolic_helper._maybe_get_const(flag, "b") for flag in (scale_grad_by_freq, sparse, include_last_offset)]
    mode_value = symbolic_helper._maybe_get_const(mode, "i")
    padding = -1 if padding_idx is None or symbolic_helper._is_none(padding_idx) else padding_idx
    padding = symbolic_helper._maybe_get_const(padding, "i")
    constants = [*flags, mode_value, padding]
    if (
        any(symbolic_helper._is_value(value) for value in constants)
        or flags[1]
        or not symbolic_helper._is_none(per_sample_weights)
    ):
        return symbolic_opset11.embedding_bag(
            g, weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights, include_last_offset,
            padding_idx,
        )  # fmt: skip
    arguments = [
        constant(g, bool(flags[0]), torch.bool),
        constant(g, int(mode_value), torch.int64),
        constant(g, bool(flags[2]), torch.bool),
        constant(g, int(padding), torch.int64),
    ]
    output = g.op(ATEN, weight, indices, offsets, *arguments, operator_s="lightning_ort::embedding_bag")
    output.setType(weight.type().with_sizes([None, None]))
    return output, None, None, None  # the bags only, as torch's own export


def register() -> None:
    """Register the symbolics and gradients with ORT's registries (process-wide)."""
    from onnxruntime.training.ortmodule import _custom_op_symbolic_registry as ort_symbolics
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("prelu", "", _prelu)
    CustomOpSymbolicRegistry.register("instance_norm", "", _instance_norm)
    CustomOpSymbolicRegistry.register("group_norm", "", _group_norm(ort_symbolics.group_norm))
    for dims in (1, 2, 3):
        CustomOpSymbolicRegistry.register(f"adaptive_max_pool{dims}d", "", _adaptive_max_pool(dims))
    CustomOpSymbolicRegistry.register("embedding_bag", "", _embedding_bag)
    register_gradient("lightning_ort::prelu", "lightning_ort::prelu_backward", ["GO(0)", "I(0)", "I(1)"],
                      ["GI(0)", "GI(1)"])  # fmt: skip
    for name in ("lightning_ort::instance_norm", "lightning_ort::batch_statistics_norm"):
        register_simple_gradient(name, f"{name}_backward", ["GO(0)", "I(0)", "I(1)"])
        register_gradient(f"{name}_affine", f"{name}_affine_backward", ["GO(0)", "I(0)", "I(1)", "I(2)", "I(3)"],
                          ["GI(0)", "GI(1)", "GI(2)"])  # fmt: skip
    for dims in (2, 3):
        register_simple_gradient(f"adaptive_max_pool{dims}d", f"adaptive_max_pool{dims}d_backward",
                                 ["GO(0)", "I(0)", "O(1)"])  # fmt: skip
    register_gradient(GROUP_NORM_AFFINE, f"{GROUP_NORM_AFFINE}_backward",
                      ["GO(0)", "I(0)", "O(1)", "O(2)", "I(1)", "I(3)", "I(4)", "I(5)", "I(6)"],
                      ["GI(0)", "GI(1)", "GI(2)"])  # fmt: skip
    register_simple_gradient("lightning_ort::group_norm", "lightning_ort::group_norm_backward",
                             ["GO(0)", "I(0)", "I(1)", "I(2)"])  # fmt: skip
    register_simple_gradient("lightning_ort::embedding_bag", "lightning_ort::embedding_bag_backward",
                             ["GO(0)", "I(0)", "I(1)", "I(2)", "I(3)", "I(4)", "I(5)", "I(6)"])  # fmt: skip
