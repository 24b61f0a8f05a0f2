"""Gradients at ORT's outputs: what autograd sees of them, and what ORT adds inside its graph.

Gradients of inputs and parameters that only outputs without a gradient depend on are ``None``.

A forward that returns more than the loss uses (a BERT pooler's output, an auxiliary head used on
some steps only) leaves eager's gradients of the parameters behind those outputs at ``None``, and
optimizers skip such parameters: no momentum step, no weight decay, no Adam state. ORT's backward
turns a missing output gradient into zeros and returns zero gradients for them instead, so SGD with
momentum kept moving them and AdamW decayed them, silently. Here each graph input's gradient is
``None`` unless an output that received a gradient depends on it in ORT's forward graph.

A gradient hook or ``retain_grad()`` on an output that other outputs are computed from (``feats`` of
``return head(feats), feats``) sees, under ORT, only the gradient of the output's own uses: the part
that flows through the other outputs is added inside ORT's graph. In eager it sees both, so a hook
that scales it trained differently, silently, and ``feats.grad`` stayed ``None``. Such a backward is
refused (:func:`hooked_inner_output`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import onnx
import torch

_CACHE_ATTR = "_lightning_ort_output_inputs"


def _node_inputs(node: onnx.NodeProto) -> Iterator[str]:
    """The node's inputs, and the outer values its subgraphs (``If``, ``Loop``, ``Scan``) read."""
    yield from node.input
    for attribute in node.attribute:
        graphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
        for graph in graphs:
            for inner in graph.node:
                yield from _node_inputs(inner)


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {name: node for node in model.graph.node for name in node.output if name}


def _cones(producers: dict[str, onnx.NodeProto], outputs: Sequence[str]) -> list[set[str]]:
    """For each of ``outputs``, the values it is computed from (itself included)."""
    cones = []
    for output in outputs:
        seen, pending = {output}, [output]
        while pending:
            node = producers.get(pending.pop())
            if node is None:
                continue
            for value in _node_inputs(node):
                if value and value not in seen:
                    seen.add(value)
                    pending.append(value)
        cones.append(seen)
    return cones


def _graph_inputs(model: onnx.ModelProto, cones: list[set[str]]) -> list[frozenset[str]]:
    graph_inputs = {value.name for value in model.graph.input}
    return [frozenset(cone & graph_inputs) for cone in cones]


def output_inputs(model: onnx.ModelProto, outputs: Sequence[str]) -> list[frozenset[str]]:
    """For each of ``outputs``, the graph inputs it is computed from."""
    return _graph_inputs(model, _cones(_producers(model), outputs))


def _upstream_outputs(
    producers: dict[str, onnx.NodeProto], outputs: Sequence[str], cones: list[set[str]]
) -> list[frozenset[int]]:
    """For each of ``outputs`` (with its ``cones``), the indices of the others it is computed from (an output
    is often an ``Identity`` of the value the graph uses)."""
    sources = []
    for output in outputs:
        source = output
        while source in producers and producers[source].op_type == "Identity":
            source = producers[source].input[0]
        sources.append(source)
    return [
        frozenset(index for index, source in enumerate(sources) if index != position and source in cone)
        for position, cone in enumerate(cones)
    ]


def _analysis(manager: Any) -> tuple[list[frozenset[str]], list[frozenset[int]]]:
    """The graph inputs and the other outputs each output of ``manager``'s current graph depends on."""
    model = manager._onnx_models.optimized_model
    cached = getattr(manager, _CACHE_ATTR, None)
    if cached is None or cached[0] is not model:
        outputs = manager._graph_info.user_output_names
        producers = _producers(model)
        cones = _cones(producers, outputs)
        cached = (model, _graph_inputs(model, cones), _upstream_outputs(producers, outputs, cones))
        setattr(manager, _CACHE_ATTR, cached)
    return cached[1], cached[2]


def hooked_inner_output(manager: Any, outputs: Sequence[Any], grad_outputs: Sequence[Any]) -> int | None:
    """The index of an output (of ``outputs``, tensors or None) with a gradient hook or ``retain_grad()``
    whose gradient, in eager, would include some that ORT adds inside its graph: one of the outputs with a
    gradient in ``grad_outputs`` is computed from it. None if there is none."""
    hooked = [
        index
        for index, output in enumerate(outputs)
        if isinstance(output, torch.Tensor) and (output._backward_hooks or output.retains_grad)
    ]
    if not hooked:
        return None
    upstream = _analysis(manager)[1]
    for index in hooked:
        if any(grad is not None and index in upstream[other] for other, grad in enumerate(grad_outputs)):
            return index
    return None


def drop_unused_gradients(manager: Any, grad_outputs: Sequence[Any], grads: tuple[Any, ...]) -> tuple[Any, ...]:
    """``grads`` (one per graph input of ORT's training ``manager``) with ``None`` for the inputs that no
    output with a gradient in ``grad_outputs`` depends on."""
    if all(grad is not None for grad in grad_outputs):
        return grads
    cones = _analysis(manager)[0]
    live = frozenset().union(*(cone for cone, grad in zip(cones, grad_outputs, strict=True) if grad is not None))
    names = manager._graph_transition_manager._post_export_processed_model_info.onnx_graph_input_names
    return tuple(None if name not in live else grad for name, grad in zip(names, grads, strict=True))
