"""A correct gradient for ORT's ``Split`` when some of its outputs get no gradient.

ORT 1.19.2's gradient of ``Split`` concatenates the gradients of the outputs that have one and
skips the others, so the input's gradient comes out too small. ORT also fuses ``Slice``/``Gather``
nodes that partition a tensor into a ``Split`` before differentiating. So ``a, b, c = x.chunk(3)``
with ``b`` unused or detached, or a detached ``qkv[1]``, crashed in the backward pass ("returned an
invalid gradient ... got [16, 8] but expected shape compatible with [24, 8]"). After ORT builds the
training graph, each such gradient ``Concat`` gets zeros of the right shape in place of the missing
gradients, through ORT's own hook for graph optimizers.
"""

from __future__ import annotations

from typing import Any

import onnx

_GRAD_SUFFIX = "_grad"


def repair_split_gradients(graph: onnx.GraphProto) -> None:
    """Give every ``Split`` gradient ``Concat`` of ``graph`` zeros for the outputs that have no gradient."""
    gradients = {node.name: node for node in graph.node if node.op_type == "Concat" and "_Grad/" in node.name}
    zero_nodes: dict[str, list[Any]] = {}  # gradient Concat's name -> the nodes it now needs first
    for split in (node for node in graph.node if node.op_type == "Split" and node.name):
        concat = gradients.get(f"{split.name}_Grad/Concat_0")
        expected = [output + _GRAD_SUFFIX for output in split.output]
        if concat is None or len(concat.input) == len(expected) or not set(concat.input) <= set(expected):
            continue
        inputs, nodes = [], []
        for output, gradient in zip(split.output, expected, strict=True):
            if gradient in concat.input:
                inputs.append(gradient)
                continue
            zeros = f"{output}_lightning_ort_zero_grad"
            nodes.extend(_zeros_like(output, zeros, f"{split.name}_Grad/lightning_ort_zeros_{len(nodes)}"))
            inputs.append(zeros)
        del concat.input[:]
        concat.input.extend(inputs)
        zero_nodes[concat.name] = nodes
    if not zero_nodes:
        return
    ordered = []
    for node in graph.node:
        ordered.extend(zero_nodes.get(node.name, []))
        ordered.append(node)
    del graph.node[:]
    graph.node.extend(ordered)


def _zeros_like(value: str, output: str, name: str) -> list[Any]:
    """Nodes computing zeros of ``value``'s shape and type (NaN- and inf-safe, unlike ``value * 0``)."""
    make = onnx.helper.make_node
    return [
        make("Constant", [], [f"{output}_scalar"], name=f"{name}/scalar", value_float=0.0),
        make("CastLike", [f"{output}_scalar", value], [f"{output}_typed"], name=f"{name}/cast"),
        make("Shape", [value], [f"{output}_shape"], name=f"{name}/shape"),
        make("Expand", [f"{output}_typed", f"{output}_shape"], [output], name=f"{name}/expand"),
    ]


def register() -> None:
    """Run :func:`repair_split_gradients` on every training graph ORTModule builds (process-wide)."""
    from onnxruntime.training.ortmodule.graph_optimizer_registry import GraphOptimizerRegistry

    GraphOptimizerRegistry.register("all", "all", 0, repair_split_gradients)
