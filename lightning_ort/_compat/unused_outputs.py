"""Gradients of inputs and parameters that only outputs without a gradient depend on are ``None``.

A forward that returns more than the loss uses (a BERT pooler's output, an auxiliary head used on
some steps only) leaves eager's gradients of the parameters behind those outputs at ``None``, and
optimizers skip such parameters: no momentum step, no weight decay, no Adam state. ORT's backward
turns a missing output gradient into zeros and returns zero gradients for them instead, so SGD with
momentum kept moving them and AdamW decayed them, silently. Here each graph input's gradient is
``None`` unless an output that received a gradient depends on it in ORT's forward graph.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import onnx

_CACHE_ATTR = "_lightning_ort_output_inputs"


def _node_inputs(node: onnx.NodeProto) -> Iterator[str]:
    """The node's inputs, and the outer values its subgraphs (``If``, ``Loop``, ``Scan``) read."""
    yield from node.input
    for attribute in node.attribute:
        graphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
        for graph in graphs:
            for inner in graph.node:
                yield from _node_inputs(inner)


def output_inputs(model: onnx.ModelProto, outputs: Sequence[str]) -> list[frozenset[str]]:
    """For each of ``outputs``, the graph inputs it is computed from."""
    producers = {name: node for node in model.graph.node for name in node.output if name}
    graph_inputs = {value.name for value in model.graph.input}
    cones = []
    for output in outputs:
        seen, pending, reached = {output}, [output], set()
        while pending:
            name = pending.pop()
            if name in graph_inputs:
                reached.add(name)
            node = producers.get(name)
            if node is None:
                continue
            for value in _node_inputs(node):
                if value and value not in seen:
                    seen.add(value)
                    pending.append(value)
        cones.append(frozenset(reached))
    return cones


def drop_unused_gradients(manager: Any, grad_outputs: Sequence[Any], grads: tuple[Any, ...]) -> tuple[Any, ...]:
    """``grads`` (one per graph input of ORT's training ``manager``) with ``None`` for the inputs that no
    output with a gradient in ``grad_outputs`` depends on."""
    if all(grad is not None for grad in grad_outputs):
        return grads
    model = manager._onnx_models.optimized_model
    cached = getattr(manager, _CACHE_ATTR, None)
    if cached is None or cached[0] is not model:
        cached = (model, output_inputs(model, manager._graph_info.user_output_names))
        setattr(manager, _CACHE_ATTR, cached)
    cones = cached[1]
    live = frozenset().union(*(cone for cone, grad in zip(cones, grad_outputs, strict=True) if grad is not None))
    names = manager._graph_transition_manager._post_export_processed_model_info.onnx_graph_input_names
    return tuple(None if name not in live else grad for name, grad in zip(names, grads, strict=True))
