"""Parameters that require grad with no path to the outputs a gradient can take.

A parameter used only in comparisons (``x.masked_fill(x > self.threshold, 0)``) or only through
``.detach()`` (a teacher network called inside ``forward``) gets no gradient in eager PyTorch: its
``.grad`` stays ``None`` and optimizers skip it. ORT refused to build a gradient graph for such a
parameter ("unreachable from the output node(s)"), and the module fell back to PyTorch. They are left
out of the inputs ORT trains, so ORT returns ``None`` for them as eager does.

The paths are followed through every op but those that carry no gradient for sure (shapes,
comparisons, indices, random draws, ``detach``); where ORT knows of more, it still refuses as before.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx

from lightning_ort.engine.ops.kernels.gradient_overloads import NON_DIFFERENTIABLE, carries_gradient
from lightning_ort.engine.passes.graph_rewrite import has_subgraphs


def without_gradient_paths(model: onnx.ModelProto, names: list[str]) -> list[str]:
    """Those of the graph inputs ``names`` from which no path a gradient can take leads to an output."""
    graph = model.graph
    if has_subgraphs(graph):
        return []  # control flow reads tensors its node does not name as inputs
    live = {output.name for output in graph.output}
    for node in reversed(graph.node):  # ONNX nodes are topologically sorted
        if carries_gradient(node) and any(name in live for name in node.output):
            live.update(node.input)
    return [name for name in names if name not in live]


def nodes_on_gradient_paths(model: onnx.ModelProto, names: list[str]) -> Iterator[tuple[onnx.NodeProto, set[str]]]:
    """The nodes that take a value computed from the graph inputs ``names`` (inputs that require grad),
    in graph order, each with the set of such values known at that node.

    Followed through everything but NON_DIFFERENTIABLE, ``detach`` included (not :func:`carries_gradient`):
    the checks built on it refuse graphs, and a path ORT may still differentiate must count."""
    reachable = set(names)
    for node in model.graph.node:  # ONNX nodes are topologically sorted
        if not any(name in reachable for name in node.input):
            continue
        yield node, reachable
        if node.op_type not in NON_DIFFERENTIABLE:
            reachable.update(node.output)
