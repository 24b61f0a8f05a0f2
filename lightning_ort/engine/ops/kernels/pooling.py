"""1-D and 3-D pooling on torch's kernels inside ORT's graph.

torch exports ``max_pool1d/3d``, ``avg_pool1d/3d`` and ``adaptive_avg_pool1d/3d`` as ONNX
``MaxPool``/``AveragePool``, whose gradient kernels in ORT 1.19.2 (``MaxPoolGrad``,
``AveragePoolGrad``) size the input's gradient from the shape the graph's shape inference gave it,
not from the run: ORTModule exports every input dimension as dynamic, so behind a convolution that
shape is unknown and the kernels write past an empty buffer (a segmentation fault), fail, or divide
by zero. ORT itself exports the 2-D forms as ATen nodes on torch's operators
(``_custom_op_symbolic_registry.py``); here the 1-D and 3-D forms, and the 2-D ``max_pool2d`` with
``return_indices=True`` that ORT leaves to torch, are too, forward and backward on torch's
operators with eager autograd's gradients (``csrc/pooling.cc`` where torch has no public
backward operator), whatever ``op_rewrites`` says.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import symbolic_helper

from lightning_ort.engine.ops.kernels.gradient_overloads import register_simple_gradient
from lightning_ort.engine.ops.kernels.torch_kernels import ATEN


def _ints(g: Any, operator: str, input: Any, value: Any, dims: int, default: list[int] | None = None) -> Any:
    """A constant int64 list of ``dims`` entries (an int stands for all of them), ``default`` when empty."""
    values = symbolic_helper._maybe_get_const(value, "is")
    if symbolic_helper._is_value(values):
        symbolic_helper._onnx_unsupported(f"{operator} with sizes that are not constant", input)
    values = [int(item) for item in values]
    if not values and default is not None:
        values = default
    if len(values) == 1:
        values = values * dims
    return g.op("Constant", value_t=torch.tensor(values, dtype=torch.int64))


def _flag(g: Any, operator: str, input: Any, value: Any) -> Any:
    flag = symbolic_helper._maybe_get_const(value, "b")
    if symbolic_helper._is_value(flag):
        symbolic_helper._onnx_unsupported(f"{operator} with a flag that is not constant", input)
    return g.op("Constant", value_t=torch.tensor(bool(flag)))


def _typed(output: Any, input: Any, dtype: torch.dtype | None = None) -> Any:
    """``output`` with ``input``'s rank (sizes unknown) and ``dtype`` (else ``input``'s)."""
    rank = symbolic_helper._get_tensor_rank(input)
    output_type = input.type() if dtype is None else input.type().with_dtype(dtype)
    output.setType(output_type if rank is None else output_type.with_sizes([None] * rank))
    return output


def _max_pool(dims: int, with_indices: bool) -> Any:
    operator = f"max_pool{dims}d_with_indices"

    def symbolic(g: Any, input: Any, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: Any) -> Any:
        kernel = _ints(g, operator, input, kernel_size, dims)
        sizes = symbolic_helper._get_const(kernel_size, "is", "kernel_size")
        arguments = [
            kernel,
            _ints(g, operator, input, stride, dims, default=list(sizes)),
            _ints(g, operator, input, padding, dims),
            _ints(g, operator, input, dilation, dims),
            _flag(g, operator, input, ceil_mode),
        ]
        output, indices = g.op(ATEN, input, *arguments, operator_s=operator, outputs=2)
        _typed(output, input)
        _typed(indices, input, torch.int64)
        return (output, indices) if with_indices else output

    return symbolic


def _avg_pool(dims: int) -> Any:
    operator = f"avg_pool{dims}d"

    def symbolic(
        g: Any,
        input: Any,
        kernel_size: Any,
        stride: Any,
        padding: Any,
        ceil_mode: Any,
        count_include_pad: Any,
        divisor_override: Any = None,
    ) -> Any:
        sizes = symbolic_helper._get_const(kernel_size, "is", "kernel_size")
        arguments = [
            _ints(g, operator, input, kernel_size, dims),
            _ints(g, operator, input, stride, dims, default=list(sizes)),
            _ints(g, operator, input, padding, dims),
            _flag(g, operator, input, ceil_mode),
            _flag(g, operator, input, count_include_pad),
        ]
        if dims == 3:
            if divisor_override is None or symbolic_helper._is_none(divisor_override):
                divisor = g.op("prim::Constant")
                divisor.setType(torch._C.NoneType.get())
            else:
                value = symbolic_helper._get_const(divisor_override, "i", "divisor_override")
                divisor = g.op("Constant", value_t=torch.tensor(int(value), dtype=torch.int64))
            arguments.append(divisor)
        return _typed(g.op(ATEN, input, *arguments, operator_s=operator), input)

    return symbolic


def _adaptive_avg_pool(dims: int) -> Any:
    operator = f"adaptive_avg_pool{dims}d"

    def symbolic(g: Any, input: Any, output_size: Any) -> Any:
        sizes = symbolic_helper._maybe_get_const(output_size, "is")
        if symbolic_helper._is_value(sizes) or any(size is None for size in sizes):
            symbolic_helper._onnx_unsupported(f"{operator} with output sizes that are not constant", input)
        return _typed(g.op(ATEN, input, _ints(g, operator, input, output_size, dims), operator_s=operator), input)

    return symbolic


def register() -> None:
    """Register the symbolics and gradients with ORT's registries (process-wide)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    for dims in (1, 3):
        CustomOpSymbolicRegistry.register(f"max_pool{dims}d", "", _max_pool(dims, with_indices=False))
        CustomOpSymbolicRegistry.register(f"max_pool{dims}d_with_indices", "", _max_pool(dims, with_indices=True))
        CustomOpSymbolicRegistry.register(f"avg_pool{dims}d", "", _avg_pool(dims))
        CustomOpSymbolicRegistry.register(f"adaptive_avg_pool{dims}d", "", _adaptive_avg_pool(dims))
    # ORT's own symbolic covers max_pool2d (and registers the gradient of its ATen node)
    CustomOpSymbolicRegistry.register("max_pool2d_with_indices", "", _max_pool(2, with_indices=True))
    pooling = ["GO(0)", "I(0)", "I(1)", "I(2)", "I(3)", "I(4)", "I(5)"]
    register_simple_gradient("max_pool1d_with_indices", "lightning_ort::max_pool1d_backward", [*pooling, "O(1)"])
    register_simple_gradient("max_pool3d_with_indices", "max_pool3d_with_indices_backward", [*pooling, "O(1)"])
    register_simple_gradient("avg_pool1d", "lightning_ort::avg_pool1d_backward", pooling)
    register_simple_gradient("avg_pool3d", "avg_pool3d_backward", [*pooling, "I(6)"])
    for dims in (1, 3):
        register_simple_gradient(
            f"adaptive_avg_pool{dims}d", f"lightning_ort::adaptive_avg_pool{dims}d_backward", ["GO(0)", "I(0)", "I(1)"]
        )
