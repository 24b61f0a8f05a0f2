"""Export forms of the ops that ORT 1.19.2's CPU kernels run slowly.

Profiling ORT's training sessions on the reference workloads (``benchmarks/NOTES.md``) found most
of ORT's deficit against eager PyTorch in three kernels, each 3-40x slower than the work eager
does for it. With ``ORTStrategy(op_rewrites=True)`` (the default on CPU), the exporter emits:

- every ``nn.ConvNd`` (``_convolution``) as an ATen node that runs torch's convolution kernel, with
  a gradient definition that runs torch's ``convolution_backward`` (``csrc/convolution.cc``),
  instead of ORT's ``Conv``/``ConvGrad``;
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
from collections.abc import Callable, Iterator
from typing import Any

import onnx
import torch
from torch.onnx._internal.torchscript_exporter import _type_utils, symbolic_helper

_ATEN = "org.pytorch.aten::ATen"
_GRAD_DOMAIN = "org.pytorch.aten"
_CONVOLUTION = "lightning_ort::convolution"
_CONVOLUTION_BIAS = "lightning_ort::convolution_bias"
_FROZEN_INPUT = "frozen_input"


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
        return g.op(_ATEN, input, weight, *layout, operator_s=_CONVOLUTION)
    return g.op(_ATEN, input, weight, bias, *layout, operator_s=_CONVOLUTION_BIAS)


def _select(g: Any, self: Any, dim: Any, index: Any) -> Any:
    from torch.onnx._internal.torchscript_exporter import symbolic_opset11

    dim_value = symbolic_helper._maybe_get_const(dim, "i")
    index_value = symbolic_helper._maybe_get_const(index, "i")
    if symbolic_helper._is_value(index_value) or symbolic_helper._is_value(dim_value):
        return symbolic_opset11.select(g, self, dim, index)
    end = torch.iinfo(torch.int64).max if index_value == -1 else index_value + 1
    sliced = symbolic_helper._slice_helper(g, self, axes=[dim_value], starts=[index_value], ends=[end])
    return symbolic_helper._squeeze_helper(g, sliced, [dim_value])


def _aten(operator: str, inputs: list[str], outputs: list[str]) -> tuple[Any, ...]:
    return ((("ATen", _GRAD_DOMAIN)), inputs, outputs, {"operator": {"value": operator, "dtype": "string"}})


def _convolution_gradient(bias: bool, input_grad: bool) -> Callable[[], list[Any]]:
    # An empty output name is a slot ORT leaves out; the kernel leaves it undefined.
    layout = [f"I({i})" for i in range(3, 9)] if bias else [f"I({i})" for i in range(2, 8)]
    inputs = ["GO(0)", "I(0)", "I(1)", "I(2)" if bias else "", *layout]
    outputs = ["GI(0)" if input_grad else "", "GI(1)", "GI(2)" if bias else ""]
    node = _aten("lightning_ort::convolution_backward", inputs, outputs)
    if not input_grad:
        node[3]["overload_name"] = {"value": _FROZEN_INPUT, "dtype": "string"}
    return lambda: [node]


SYMBOLICS = {"relu": _relu_by_mask, "_convolution": _convolution, "select": _select}


def register_gradients() -> None:
    """Give ORT's gradient builder the convolutions' gradients (process-wide; unused without the rewrites)."""
    from onnxruntime.training.ortmodule._custom_gradient_registry import CustomGradientRegistry

    register = CustomGradientRegistry.register
    for bias, operator in ((False, _CONVOLUTION), (True, _CONVOLUTION_BIAS)):
        register(_GRAD_DOMAIN, "ATen", (operator, ""), _convolution_gradient(bias, input_grad=True))
        register(_GRAD_DOMAIN, "ATen", (operator, _FROZEN_INPUT), _convolution_gradient(bias, input_grad=False))


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


def mark_frozen_inputs(model: onnx.ModelProto, inputs_requiring_grad: list[str]) -> None:
    """Give convolutions whose input needs no gradient the overload whose gradient leaves it out.

    ORT gives such an input's gradient no place in the graph; its gradient builder needs to be told
    with a separate definition. "Needs a gradient" is taken as "computed from a graph input that
    requires one" (over all edges; ORT's own analysis also stops at non-differentiable edges, a
    difference that would make ORT's backward fail loudly, never compute wrongly).
    """
    reachable = set(inputs_requiring_grad)
    for node in model.graph.node:  # ONNX nodes are topologically sorted
        if any(name in reachable for name in node.input):
            reachable.update(node.output)
        if node.domain == _GRAD_DOMAIN and node.op_type == "ATen":
            attributes = {attribute.name: attribute for attribute in node.attribute}
            if attributes["operator"].s.decode() in (_CONVOLUTION, _CONVOLUTION_BIAS):
                overload = b"" if node.input[0] in reachable else _FROZEN_INPUT.encode()
                if "overload_name" in attributes:
                    attributes["overload_name"].s = overload
                else:
                    node.attribute.append(onnx.helper.make_attribute("overload_name", overload))
