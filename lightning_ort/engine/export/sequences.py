"""ONNX sequences on a gradient path, which ORT does not differentiate.

torch exports some calls returning a list as an ONNX sequence (``SplitToSequence``, ``SequenceAt``,
...): ``tensor_split`` at a tensor of indices, for one. ORT has no gradient for sequence ops and
leaves their edges out of its gradient graph without an error, so training through one was
silently wrong wherever another path reached the same parameters (``tensor_split``, before
tensor_splits.py). Such graphs are refused, and the module trains in PyTorch.
"""

from __future__ import annotations

import onnx

from lightning_ort.engine.passes.gradient_paths import nodes_on_gradient_paths
from lightning_ort.errors import ORTUnsupportedModelError

# sequence ops a gradient would have to pass through (a sequence's length carries none)
_SEQUENCE_OPS = frozenset(
    {"SequenceAt", "SequenceConstruct", "SequenceInsert", "SequenceErase", "SplitToSequence", "ConcatFromSequence"}
)


def check_sequences(model: onnx.ModelProto, inputs_requiring_grad: list[str]) -> None:
    """Raise if a value computed from a graph input that requires grad goes into a sequence op."""
    for node, _ in nodes_on_gradient_paths(model, inputs_requiring_grad):
        if node.op_type in _SEQUENCE_OPS and node.domain in ("", "ai.onnx"):
            raise ORTUnsupportedModelError(
                f"its graph passes values that need gradients through an ONNX sequence ({node.op_type} node "
                f"{node.name or node.output[0]}), which torch's export makes of some calls that return lists "
                "(tensor_split at a tensor of indices); ORT has no gradient for sequences and would leave those "
                "gradients out. Fix: split with slices, Tensor.split or Tensor.chunk, or keep that module out of ORT "
                "with ORTStrategy(modules=[...])"
            )
