"""LSTM and GRU layers with frozen weights on a gradient path, which crash ORT's backward.

torch exports ``nn.LSTM`` and ``nn.GRU`` as ONNX ``LSTM``/``GRU`` nodes, which ORT differentiates
with its own kernels. When a gradient passes through such a node (its input comes from trained
layers) but one of its weight matrices (``W``, ``R``) needs none (a frozen pretrained recurrent layer
under a trained embedding: ``BaseFinetuning.freeze(rnn)``, ``rnn.weight_ih_l0.requires_grad_(False)``),
ORT 1.19.2's backward crashes the whole process (SIGSEGV). Such graphs are refused, and the module
trains in PyTorch. Frozen biases alone (``B``) are fine.
"""

from __future__ import annotations

import onnx

from lightning_ort.engine.passes.gradient_paths import nodes_on_gradient_paths
from lightning_ort.errors import ORTUnsupportedModelError

_RECURRENT_OPS = frozenset({"LSTM", "GRU"})
_WEIGHTS = {1: "W", 2: "R"}  # input positions of ONNX's LSTM and GRU


def check_recurrent_weights(model: onnx.ModelProto, inputs_requiring_grad: list[str]) -> None:
    """Raise if an LSTM or GRU node on a gradient path has a weight matrix that needs no gradient."""
    for node, reachable in nodes_on_gradient_paths(model, inputs_requiring_grad):
        if node.op_type not in _RECURRENT_OPS or node.domain not in ("", "ai.onnx"):
            continue
        frozen = [name for index, name in _WEIGHTS.items() if node.input[index] not in reachable]
        if frozen:
            raise ORTUnsupportedModelError(
                f"an nn.{node.op_type} in its graph ({node.name or node.output[0]}) passes gradients on while its "
                f"weights {', '.join(frozen)} are frozen (requires_grad=False); ORT 1.19.2's {node.op_type} backward "
                "crashes the process then. Fix: freeze the layers before it as well, train all of its weights, or "
                "keep that module out of ORT with ORTStrategy(modules=[...])"
            )
