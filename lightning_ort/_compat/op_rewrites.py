"""Export forms of the ops that ORT 1.19.2's CPU kernels run slowly.

Profiling ORT's training sessions on the reference workloads (``benchmarks/NOTES.md``) found most
of ORT's deficit against eager PyTorch in three kernels, each 3-40x slower than the work eager
does for it. With ``ORTStrategy(op_rewrites=True)`` (the default on CPU), the exporter emits:

- every ``nn.ConvNd`` (``_convolution``, and ``_convolution_mode`` for ``padding="same"|"valid"``)
  as an ATen node that runs torch's convolution kernel, with a gradient definition that runs
  torch's ``convolution_backward`` (``csrc/aten_ops.cc``), instead of ORT's ``Conv``/``ConvGrad``;
- ``relu`` as ``x * (x > 0)``, whose gradient ORT builds from one ``Mul`` instead of its
  ``ReluGrad`` kernel. Identical results except for ``relu(-inf)``, which becomes NaN instead of 0;
- ``select`` with a constant index (``x[:, 0]``, the q/k/v split inside ``nn.MultiheadAttention``) as
  ``Slice`` + ``Squeeze``, whose gradient is a ``SliceGrad`` copy instead of the ``GatherGrad``
  scatter that ``Gather`` gets.

torch's kernels run only where they win big: a torch kernel inside the ORT graph leaves torch's
OpenMP threads spinning on the cores ORT's next kernel needs, which cost more than it saved for
cheap element-wise ops (measured for ReLU and GELU).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import _type_utils, symbolic_helper

from lightning_ort._compat.conv_padding import convolution_mode_symbolic, explicit_padding
from lightning_ort._compat.gradient_overloads import register_gradient

_ATEN = "org.pytorch.aten::ATen"
_CONVOLUTION = "lightning_ort::convolution"
_CONVOLUTION_BIAS = "lightning_ort::convolution_bias"
_CONVOLUTION_BACKWARD = "lightning_ort::convolution_backward"


def _relu_by_mask(g: Any, input: Any) -> Any:
    scalar_type = _type_utils.JitScalarType.from_value(input, _type_utils.JitScalarType.FLOAT)
    zero = g.op("Constant", value_t=torch.tensor(0, dtype=scalar_type.dtype()))
    return g.op("Mul", input, g.op("Cast", g.op("Greater", input, zero), to_i=scalar_type.onnx_type()))


def _convolution(
    g: Any,
    input: Any,
    weight: Any,
    bias: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: Any,
    output_padding: Any,
    groups: Any,
    *_flags: Any,
) -> Any:
    layout = (stride, padding, dilation, transposed, output_padding, groups)
    if bias is None or symbolic_helper._is_none(bias):
        output = g.op(_ATEN, input, weight, *layout, operator_s=_CONVOLUTION)
    else:
        output = g.op(_ATEN, input, weight, bias, *layout, operator_s=_CONVOLUTION_BIAS)
    _set_channels(output, input, weight, transposed, groups)
    return output


def _set_channels(output: Any, input: Any, weight: Any, transposed: Any, groups: Any) -> None:
    """Give the ATen node's output the rank and channel count of the convolution's result (later
    symbolics such as a non-affine BatchNorm's need the channels)."""
    rank = symbolic_helper._get_tensor_rank(input)
    weight_sizes = symbolic_helper._get_tensor_sizes(weight)
    is_transposed = symbolic_helper._maybe_get_const(transposed, "b")
    group_count = symbolic_helper._maybe_get_const(groups, "i")
    if rank is None or not weight_sizes or not isinstance(group_count, int) or not isinstance(is_transposed, bool):
        return
    channels = weight_sizes[1] * group_count if is_transposed else weight_sizes[0]
    if not isinstance(channels, int):
        return
    output.setType(input.type().with_sizes([None, channels] + [None] * (rank - 2)))


def _convolution_mode(
    g: Any, input: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any, groups: Any
) -> Any:
    """``padding="same"`` / ``"valid"``: explicit padding (conv_padding.py), then torch's kernel."""
    plan = explicit_padding(g, input, weight, stride, padding, dilation)
    if plan is None:
        return convolution_mode_symbolic(g, input, weight, bias, stride, padding, dilation, groups)
    input, strides, pads, dilations = plan

    def ints(values: list[int]) -> Any:
        return g.op("Constant", value_t=torch.tensor(values, dtype=torch.int64))

    transposed = g.op("Constant", value_t=torch.tensor(False))
    zeros = ints([0] * len(pads))
    return _convolution(g, input, weight, bias, ints(strides), ints(pads), ints(dilations), transposed, zeros, groups)


def _select(g: Any, self: Any, dim: Any, index: Any) -> Any:
    from torch.onnx._internal.torchscript_exporter import symbolic_opset11

    dim_value = symbolic_helper._maybe_get_const(dim, "i")
    index_value = symbolic_helper._maybe_get_const(index, "i")
    if symbolic_helper._is_value(index_value) or symbolic_helper._is_value(dim_value):
        return symbolic_opset11.select(g, self, dim, index)
    end = torch.iinfo(torch.int64).max if index_value == -1 else index_value + 1
    sliced = symbolic_helper._slice_helper(g, self, axes=[dim_value], starts=[index_value], ends=[end])
    return symbolic_helper._squeeze_helper(g, sliced, [dim_value])


SYMBOLICS = {
    "relu": _relu_by_mask,
    "_convolution": _convolution,
    "_convolution_mode": _convolution_mode,
    "select": _select,
}


def register_gradients() -> None:
    """Give ORT's gradient builder the convolutions' gradients (process-wide; unused without the rewrites)."""
    layout = [f"I({i})" for i in range(2, 8)]
    inputs = ["GO(0)", "I(0)", "I(1)", "", *layout]
    register_gradient(_CONVOLUTION, _CONVOLUTION_BACKWARD, inputs, "GI(0)", ["GI(1)", ""])
    layout = [f"I({i})" for i in range(3, 9)]
    inputs = ["GO(0)", "I(0)", "I(1)", "I(2)", *layout]
    register_gradient(_CONVOLUTION_BIAS, _CONVOLUTION_BACKWARD, inputs, "GI(0)", ["GI(1)", "GI(2)"])


@contextlib.contextmanager
def rewritten_symbolics(enabled: bool, opset: int) -> Iterator[None]:
    """Within the block, torch's exporter emits the forms above (when ``enabled``).

    The rules they replace for the block (torch's, or ORT's own for ``_convolution``) are put back
    afterwards, so other exports in the process are unaffected.
    """
    if not enabled:
        yield
        return
    from torch.onnx._internal.torchscript_exporter import registration

    replaced: list[tuple[Any, Any]] = []
    for name, function in SYMBOLICS.items():
        qualified = f"aten::{name}"
        group = registration.registry.get_function_group(qualified)
        previous = None if group is None else group._functions._overrides.get(opset)
        registration.registry.register(qualified, opset, function, custom=True)
        replaced.append((registration.registry.get_function_group(qualified), previous))
    try:
        yield
    finally:
        for group, previous in replaced:
            group.remove_custom(opset)
            if previous is not None:
                group.add_custom(previous, opset)
