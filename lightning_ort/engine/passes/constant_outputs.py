"""Graph outputs that are constants, kept computed so that ORT's gradient builder accepts the graph.

A forward may return a tensor it creates from Python numbers alone: transformers' sliding-window cache layer
(Mistral's ``DynamicSlidingWindowLayer``) holds ``torch.tensor(sliding_window)``, and the cache a causal LM
returns carries it out of the graph. The export writes it as a ``Constant``; ORT's optimizer folds it into an
initializer, and its gradient builder then refuses the graph ("couldn't find the producer node, and it's not a
graph input"), which sent Mistral's whole forward to graph breaks. Here such an output gets a producer that
ORT cannot fold: the constant plus zero times a symbolic dimension of an input (the same value, exactly).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
from onnx import TensorProto, helper

_NUMERIC = {
    TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.INT8,
    TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8,
}  # fmt: skip


def _constant_sources(graph: onnx.GraphProto) -> Callable[[str], bool]:
    """Whether a value is a ``Constant`` node's output, or an initializer, through ``Identity`` nodes; the
    graph's producers and initializers are indexed once for all the outputs asked about."""
    producers = {output: node for node in graph.node for output in node.output}
    initializers = {initializer.name for initializer in graph.initializer}
    inputs = {value.name for value in graph.input}

    def constant(name: str) -> bool:
        for _ in range(100):
            if name in initializers and name not in inputs:
                return True
            node = producers.get(name)
            if node is None:
                return False
            if node.op_type == "Constant":
                return True
            if node.op_type != "Identity":
                return False
            name = node.input[0]
        return False

    return constant


def _symbolic_input(graph: onnx.GraphProto) -> tuple[str, int] | None:
    """An input and one of its dimensions whose size the graph does not know (a ``dim_param``)."""
    initializers = {initializer.name for initializer in graph.initializer}
    for value in graph.input:
        if value.name in initializers or not value.type.HasField("tensor_type"):
            continue
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_param") or not dim.HasField("dim_value"):
                return value.name, axis
    return None


def keep_constant_outputs_computed(model: onnx.ModelProto) -> list[str]:
    """Give each graph output that is a numeric constant a producer ORT's optimizer cannot fold; returns their
    names. Outputs of other types, or graphs without an input of unknown size, are left as they are."""
    graph = model.graph
    is_constant = _constant_sources(graph)
    constant = [
        output for output in graph.output if output.type.tensor_type.elem_type in _NUMERIC and is_constant(output.name)
    ]
    symbolic = _symbolic_input(graph) if constant else None
    if symbolic is None:
        return []
    source, axis = symbolic
    prefix = "lightning_ort_constant_output"
    size = f"{prefix}_size"
    axis_value = helper.make_tensor("axis", TensorProto.INT64, [], [axis])
    zero_value = helper.make_tensor("zero", TensorProto.INT64, [], [0])
    graph.node.extend(
        [
            helper.make_node("Shape", [source], [f"{prefix}_shape"], name=f"{prefix}_Shape"),
            helper.make_node("Constant", [], [f"{prefix}_axis"], value=axis_value),
            helper.make_node("Gather", [f"{prefix}_shape", f"{prefix}_axis"], [size], name=f"{prefix}_Gather", axis=0),
            helper.make_node("Constant", [], [f"{prefix}_zero"], value=zero_value),
            helper.make_node("Mul", [size, f"{prefix}_zero"], [f"{prefix}_nothing"], name=f"{prefix}_Mul"),
        ]
    )
    renamed = []
    for index, output in enumerate(constant):
        kept = f"{prefix}_{index}_value"
        for node in graph.node:  # the constant's producer now writes `kept`; the output is `kept` + 0
            node.output[:] = [kept if name == output.name else name for name in node.output]
            node.input[:] = [kept if name == output.name else name for name in node.input]
        for initializer in graph.initializer:
            if initializer.name == output.name:
                initializer.name = kept
        nothing = f"{prefix}_{index}_nothing"
        graph.node.extend(
            [
                helper.make_node("Cast", [f"{prefix}_nothing"], [nothing], name=f"{prefix}_{index}_Cast",
                                 to=output.type.tensor_type.elem_type),
                helper.make_node("Add", [kept, nothing], [output.name], name=f"{prefix}_{index}_Add"),
            ]
        )  # fmt: skip
        renamed.append(output.name)
    return renamed
