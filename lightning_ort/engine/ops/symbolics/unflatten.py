"""``Tensor.unflatten`` with the output's rank known to the export.

torch's symbolic reshapes to a shape whose parts it slices from the input's shape at positions it
computes in the graph, so the export's shape inference cannot tell the output's rank and torch kept
the traced output's sizes, all fixed: sizes read from the result (``n, t, d = h.shape``) were folded
into the first batch's numbers, and later batches with as many elements reshaped silently into the
wrong rows (losses 10.66 / 6.86 against eager's 10.66 / 4.57). Here the slices have constant bounds,
and the output is typed with its rank and unknown sizes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import symbolic_helper, symbolic_opset13

from lightning_ort.engine.ops.kernels.torch_kernels import constant


def _unflatten(g: Any, input: Any, dim: Any, unflattened_size: Any) -> Any:
    rank = symbolic_helper._get_tensor_rank(input)
    axis = symbolic_helper._maybe_get_const(dim, "i")
    if rank is None or symbolic_helper._is_value(axis):
        return symbolic_opset13.unflatten(g, input, dim, unflattened_size)
    axis = int(axis) % rank
    if symbolic_helper._is_packed_list(unflattened_size):
        parts = symbolic_helper._unpack_list(unflattened_size)
        sizes = g.op("Concat", *[g.op("Reshape", part, constant(g, [1], torch.int64)) for part in parts], axis_i=0)
        count = len(parts)
    else:
        values = symbolic_helper._maybe_get_const(unflattened_size, "is")
        if symbolic_helper._is_value(values):
            return symbolic_opset13.unflatten(g, input, dim, unflattened_size)
        sizes, count = constant(g, list(values), torch.int64), len(values)
    shape = g.op("Shape", input)
    head = g.op("Slice", shape, constant(g, [0], torch.int64), constant(g, [axis], torch.int64))
    tail = g.op("Slice", shape, constant(g, [axis + 1], torch.int64), constant(g, [rank], torch.int64))
    output = g.op("Reshape", input, g.op("Concat", head, sizes, tail, axis_i=0))
    output.setType(input.type().with_sizes([None] * (rank - 1 + count)))
    return output


def register() -> None:
    """Register the symbolic with ORT's registry (process-wide)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("unflatten", "", _unflatten)
