"""``unsafe_chunk`` of a dimension whose size the export does not know.

``nn.GRUCell`` and ``nn.LSTMCell`` split their gate pre-activations with ``unsafe_chunk``, and torch's
symbolic refuses it ("unknown dimension size") unless the export's shape inference knows the size
of the split dimension. It does not behind some ops: a decoder loop that feeds the cell the
embedding of its own ``argmax`` fell back to PyTorch. The sizes of the parts are computed in the
graph instead, as torch's ``chunk`` symbolic already does; ORT differentiates that ``Split``.
"""

from __future__ import annotations

from typing import Any

from torch.onnx._internal.torchscript_exporter import symbolic_helper, symbolic_opset13

from lightning_ort._compat.torch_kernels import constant


@symbolic_helper.parse_args("v", "i", "i", "i")
def _unsafe_chunk(g: Any, input: Any, chunks: int, dim: int, _outputs: int | None = None) -> Any:
    if _outputs is None or symbolic_helper._get_tensor_dim_size(input, dim) is not None:
        return symbolic_opset13.unsafe_chunk(g, input, chunks, dim, _outputs)
    size = g.op("Gather", g.op("Shape", input), constant(g, [dim]), axis_i=0)
    # torch's parts: ceil(size / chunks) each, the last one what is left
    part = g.op("Div", g.op("Add", size, constant(g, [chunks - 1])), constant(g, [chunks]))
    last = g.op("Sub", size, g.op("Mul", part, constant(g, [_outputs - 1])))
    sizes = g.op("Concat", *[part] * (_outputs - 1), last, axis_i=0)
    return g.op("Split", input, sizes, axis_i=dim, outputs=_outputs)


def register() -> None:
    """Register the symbolic with ORT's registry (process-wide)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("unsafe_chunk", "", _unsafe_chunk)
