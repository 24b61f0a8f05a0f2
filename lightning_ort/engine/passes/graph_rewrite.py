"""An exported ONNX graph indexed for rewrites after the export (unbind.py, attention_fusion.py)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper


class GraphRewrite:
    """The graph's producers, users, constants and shapes, and the replacements found so far.

    A rewrite calls :meth:`replace` for every pattern it finds, then :meth:`finish` once."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.users: dict[str, list[onnx.NodeProto]] = {}
        self.producers: dict[str, onnx.NodeProto] = {}
        for node in graph.node:
            for name in node.input:
                self.users.setdefault(name, []).append(node)
            for name in node.output:
                self.producers[name] = node
        self.constants: dict[str, np.ndarray] = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
                self.constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        self.shapes: dict[str, list[int | None]] = {}
        for info in [*graph.input, *graph.value_info, *graph.output]:
            if info.type.tensor_type.HasField("shape"):
                dims = info.type.tensor_type.shape.dim
                self.shapes[info.name] = [dim.dim_value if dim.HasField("dim_value") else None for dim in dims]
        self.outputs = {output.name for output in graph.output}
        self.removed: set[int] = set()  # id() of the nodes replaced
        self.before: dict[int, list[onnx.NodeProto]] = {}  # id() of a replaced node -> the nodes in its place
        self.count = 0

    def dim(self, name: str, index: int) -> int | None:
        """Size ``index`` of tensor ``name``, when the export knows it."""
        shape = self.shapes.get(name)
        return shape[index] if shape is not None and index < len(shape) else None

    def scalar(self, name: str) -> int | float | bool | None:
        """The value of ``name`` when it is a constant of one element, as a Python number, else None."""
        value = self.constants.get(name)
        return value.reshape(-1)[0].item() if value is not None and value.size == 1 else None

    def only_user(self, name: str) -> onnx.NodeProto | None:
        """The one node that reads tensor ``name``, or None (several, none, or a graph output)."""
        users = self.users.get(name, [])
        return users[0] if len(users) == 1 and name not in self.outputs else None

    def replace(self, removed: list[onnx.NodeProto], nodes: list[onnx.NodeProto]) -> bool:
        """Put ``nodes`` where ``removed[0]`` is, and drop all of ``removed`` (on :meth:`finish`);
        False (and nothing done) when one of ``removed`` is already replaced."""
        if any(id(node) in self.removed for node in removed):
            return False
        self.before[id(removed[0])] = nodes
        self.removed.update(id(node) for node in removed)
        self.count += 1
        return True

    def finish(self) -> int:
        """Apply the replacements and drop what they left unread; how many were made."""
        if not self.count:
            return 0
        nodes: list[onnx.NodeProto] = []
        for node in self.graph.node:
            nodes.extend(self.before.get(id(node), []))
            if id(node) not in self.removed:
                nodes.append(node)
        del self.graph.node[:]
        self.graph.node.extend(_without_dead_nodes(nodes, self.outputs))
        return self.count


def _without_dead_nodes(nodes: list[onnx.NodeProto], graph_outputs: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` less the standard ONNX ones whose outputs no one reads any more (the constants and
    shape arithmetic of the nodes replaced; ORT warns about unused initializers)."""
    used = set(graph_outputs)
    kept = []
    for node in reversed(nodes):
        if node.domain in ("", "ai.onnx") and not any(name in used for name in node.output):
            continue
        used.update(node.input)
        kept.append(node)
    return kept[::-1]


def has_subgraphs(graph: onnx.GraphProto) -> bool:
    """Whether a node holds a subgraph (control flow), which could read tensors a rewrite removes."""
    return any(
        attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        for node in graph.node
        for attribute in node.attribute
    )
