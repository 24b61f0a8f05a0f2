"""BatchNorm layers called more than once in one forward, on inputs that do not depend on each other.

Each training-mode call updates the layer's running statistics in place (``batchnorm.py``), and
momentum updates do not commute: the order of the calls decides the result. In eager PyTorch it is
the order of the code. In ORT's graph, calls whose inputs do not depend on each other (two views
of a siamese network, the support and query sets of a prototypical network) have no edge between
them, and ORT ran them in the other order when their consumers were arranged so: weights and losses
stayed equal, the running statistics silently did not (10% off after one step).
"""

from __future__ import annotations

import itertools

import onnx

from lightning_ort.engine.ops.kernels.gradient_overloads import aten_operator
from lightning_ort.errors import ORTUnsupportedModelError

_UPDATING = frozenset({"lightning_ort::batch_norm", "lightning_ort::batch_norm_nhwc"})
_RUNNING_MEAN, _TRAINING = 3, 5  # inputs of the ATen node


def check_batch_norm_order(model: onnx.ModelProto) -> None:
    """Raise :class:`ORTUnsupportedModelError` when two calls of one training-mode BatchNorm in ``model`` have
    no path between them (the graph's node order is the trace's, eager's)."""
    nodes = list(model.graph.node)
    constants = {node.output[0]: node for node in nodes if node.op_type == "Constant"}
    calls: dict[str, list[int]] = {}
    for index, node in enumerate(nodes):
        if aten_operator(node) in _UPDATING and _in_training(node.input[_TRAINING], constants):
            calls.setdefault(node.input[_RUNNING_MEAN], []).append(index)
    if not any(len(indices) > 1 for indices in calls.values()):
        return
    producers = {name: index for index, node in enumerate(nodes) for name in node.output}
    unordered = [
        running_mean.removeprefix("_original_module.").removesuffix(".running_mean")
        for running_mean, indices in calls.items()
        if any(not _depends(nodes, producers, later, earlier) for earlier, later in itertools.pairwise(indices))
    ]
    if unordered:
        raise ORTUnsupportedModelError(
            f"BatchNorm layer(s) {', '.join(unordered)} are called more than once in one forward on inputs that do "
            "not depend on each other (two views, a support and a query set); ORT may run the calls in another "
            "order than eager, and the running statistics each call updates would differ. Fix: call the layer once "
            "on the concatenated inputs if they may share batch statistics, or keep the module in PyTorch with "
            "ORTStrategy(modules=[...])"
        )


def _in_training(name: str, constants: dict[str, onnx.NodeProto]) -> bool:
    """Whether the node's ``training`` input is true (or not a constant this can read)."""
    node = constants.get(name)
    if node is None:
        return True
    value = next((attribute.t for attribute in node.attribute if attribute.name == "value"), None)
    return value is None or bool(onnx.numpy_helper.to_array(value).any())


def _depends(nodes: list[onnx.NodeProto], producers: dict[str, int], later: int, earlier: int) -> bool:
    """Whether node ``later`` reads, directly or not, an output of node ``earlier``."""
    seen, stack = set(), [later]
    while stack:
        index = stack.pop()
        for name in nodes[index].input:
            producer = producers.get(name)
            if producer == earlier:
                return True
            if producer is not None and producer > earlier and producer not in seen:
                seen.add(producer)
                stack.append(producer)
    return False
