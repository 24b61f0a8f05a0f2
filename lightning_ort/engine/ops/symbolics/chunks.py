"""``unsafe_chunk`` and ``split`` of a dimension whose size the export does not know.

``nn.GRUCell`` and ``nn.LSTMCell`` split their gate pre-activations with ``unsafe_chunk``, and torch's
symbolic refuses it ("unknown dimension size") unless the export's shape inference knows the size
of the split dimension. It does not behind some ops: a decoder loop that feeds the cell the
embedding of its own ``argmax`` fell back to PyTorch. The sizes of the parts are computed in the
graph instead, as torch's ``chunk`` symbolic already does; ORT differentiates that ``Split``.

``x.split(4, dim=1)`` of a length the export does not know (every sequence dimension) got the sizes
``[4] * parts``: a length of 7 failed in ORT ("Cannot split using values in 'split' attribute"), so
the module never ran in ORT. The last part's size is computed in the graph too, held between 1 and
the split size: a length that needs another number of parts than the export's first batch still
fails loudly (the sizes no longer add up) instead of splitting silently into the wrong parts.

Silently wrong before: ``q, k, v = qkv.chunk(3, dim=-1)`` (traced as ``prim::ConstantChunk``) was
exported by ORT's symbolic as a ``Split`` whose sizes are computed in the graph. The export's shape
inference cannot tell the parts' shapes from such a ``Split``, so torch kept the traced ones, all of
them fixed, and folded the parts' ``.shape`` into constants: vit-pytorch's ``b, n, hd = t.shape``
then ``t.reshape(b, n, h, hd // h)`` kept the first batch's sizes. A later batch with as many tokens
reshaped without error and mixed tokens across samples; one with another count failed in ORT. A
chunk of a dimension of known size now splits into constant sizes (its parts keep the symbolic
sizes of the other dimensions), and the parts of every computed ``Split`` are typed with the sizes
the export knows, the split dimension unknown.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import symbolic_helper, symbolic_opset13

from lightning_ort.engine.ops.kernels.torch_kernels import constant


def _typed(g: Any, input: Any, sizes: Any, dim: int, outputs: int) -> Any:
    """``input`` split along ``dim`` into ``outputs`` parts of ``sizes``, each typed with the sizes the
    export knows of ``input`` but the split dimension's: never the traced batch's."""
    parts = g.op("Split", input, sizes, axis_i=dim, outputs=outputs)
    parts = [parts] if outputs == 1 else list(parts)
    known = symbolic_helper._get_tensor_sizes(input)
    if known is not None:
        known[dim] = None
        for part in parts:
            part.setType(input.type().with_sizes(known))
    return parts[0] if outputs == 1 else parts


def _constant_chunk(g: Any, input: Any, chunks: int, dim: int) -> Any:
    """``Tensor.chunk`` as the tracer records it (``prim::ConstantChunk``)."""
    outputs = g.original_node.outputsSize()
    if chunks == 1 or outputs == 1:
        return input
    size = symbolic_helper._get_tensor_dim_size(input, dim)
    if size is not None:
        part = -(-size // chunks)
        sizes = [part] * (size // part) + ([size % part] if size % part else [])
        if len(sizes) == outputs:
            return g.op("Split", input, constant(g, sizes, torch.int64), axis_i=dim, outputs=outputs)
    size = g.op("Gather", g.op("Shape", input), constant(g, [dim]), axis_i=0)
    part = g.op("Div", g.op("Add", size, constant(g, [chunks - 1])), constant(g, [chunks]))
    last = g.op("Sub", size, g.op("Mul", part, constant(g, [outputs - 1])))
    return _typed(g, input, g.op("Concat", *[part] * (outputs - 1), last, axis_i=0), dim, outputs)


@symbolic_helper.parse_args("v", "i", "i", "i")
def _unsafe_chunk(g: Any, input: Any, chunks: int, dim: int, _outputs: int | None = None) -> Any:
    if _outputs is None or symbolic_helper._get_tensor_dim_size(input, dim) is not None:
        return symbolic_opset13.unsafe_chunk(g, input, chunks, dim, _outputs)
    size = g.op("Gather", g.op("Shape", input), constant(g, [dim]), axis_i=0)
    # torch's parts: ceil(size / chunks) each, the last one what is left
    part = g.op("Div", g.op("Add", size, constant(g, [chunks - 1])), constant(g, [chunks]))
    last = g.op("Sub", size, g.op("Mul", part, constant(g, [_outputs - 1])))
    return _typed(g, input, g.op("Concat", *[part] * (_outputs - 1), last, axis_i=0), dim, _outputs)


def _split(g: Any, input: Any, split_size_or_sizes: Any, dim: Any, _outputs: int | None = None) -> Any:
    axis = symbolic_helper._maybe_get_const(dim, "i")
    split_size = symbolic_helper._maybe_get_const(split_size_or_sizes, "i")
    if (
        _outputs is None
        or _outputs < 2
        or not isinstance(axis, int)
        or not isinstance(split_size, int)
        or symbolic_helper._get_tensor_dim_size(input, axis) is not None
    ):
        return symbolic_opset13.split(g, input, split_size_or_sizes, dim, _outputs)
    size = g.op("Gather", g.op("Shape", input), constant(g, [axis]), axis_i=0)
    last = g.op("Sub", size, constant(g, [split_size * (_outputs - 1)]))
    last = g.op("Max", g.op("Min", last, constant(g, [split_size])), constant(g, [1]))
    sizes = g.op("Concat", constant(g, [split_size] * (_outputs - 1)), last, axis_i=0)
    return _typed(g, input, sizes, axis, _outputs)


def register() -> None:
    """Register the symbolics with ORT's registry (process-wide)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("unsafe_chunk", "", _unsafe_chunk)
    CustomOpSymbolicRegistry.register("split", "", _split)
    CustomOpSymbolicRegistry.register("ConstantChunk", "prim", _constant_chunk)  # in place of ORT's
