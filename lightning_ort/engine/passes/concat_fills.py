"""Concatenations with constant-filled tensors, rewritten as padding ORT can differentiate.

ORT 1.19.2's gradient of ``Concat`` names a gradient for every input, needed or not, after the input
(``<name>_grad``). When one constant-filled tensor (``ConstantOfShape``) is concatenated by two nodes,
both write ``<name>_grad`` and ORT rejects its own gradient graph ("Duplicate definition of name
(.../ConstantOfShape_output_0_grad)"); ORT's graph optimizations first merge equal fills, so this
happens even when the export had one fill per ``Concat``.
``nn.MultiheadAttention(add_bias_kv=True, add_zero_attn=True)`` (one zero key and value) did this
and fell back to PyTorch. :func:`pad_constant_fills` rewrites each
floating ``Concat`` with such fills as a constant ``Pad`` of its other inputs by the fills' sizes
along the axis: the same values, and ``Pad``'s gradient names only its data input's.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

_FILL = "ConstantOfShape"
_FLOATING = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}


def pad_constant_fills(model: onnx.ModelProto) -> None:
    """Rewrite each ``Concat`` of floating ``ConstantOfShape`` fills (one value) and other tensors as ``Pad``s."""
    graph = model.graph
    producers = {output: node for node in graph.node for output in node.output}
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        rewritten = _rewrite(node, producers) if node.op_type == "Concat" and not node.domain else None
        nodes.extend(rewritten if rewritten is not None else [node])
    if len(nodes) != len(graph.node):
        del graph.node[:]
        graph.node.extend(nodes)


def _rewrite(node: onnx.NodeProto, producers: dict[str, onnx.NodeProto]) -> list[onnx.NodeProto] | None:
    """The nodes replacing ``node``, or None to keep it."""
    fills = [producers[name] if name in producers and producers[name].op_type == _FILL else None for name in node.input]
    values = [_fill_value(fill) for fill in fills if fill is not None]
    if not values or all(fills) or len({(value.dtype, value.tobytes()) for value in values}) > 1:
        return None
    if numpy_helper.from_array(values[0]).data_type not in _FLOATING:
        return None  # shapes and indices: no gradient
    output = node.output[0]
    axis = helper.get_attribute_value(next(a for a in node.attribute if a.name == "axis"))
    prefix = f"{output}_fill"
    rank = f"{prefix}_rank"
    nodes = [
        helper.make_node("Constant", [], [f"{prefix}_value"], value=numpy_helper.from_array(values[0].reshape(()))),
        helper.make_node("Constant", [], [f"{prefix}_axis"], value=_ints([axis])),
        helper.make_node("Constant", [], [f"{prefix}_zero"], value=_ints([0])),
        helper.make_node("Shape", [next(fill for fill in fills if fill is not None).input[0]], [rank]),
        helper.make_node("Add", [rank, rank], [f"{prefix}_pads_size"]),
        helper.make_node("ConstantOfShape", [f"{prefix}_pads_size"], [f"{prefix}_no_pads"], value=_ints([0])),
    ]
    # pads are [begin of each dimension, end of each dimension]; a negative axis counts from the rank
    begin, end = f"{prefix}_begin_index", f"{prefix}_end_index"
    if axis >= 0:
        nodes.append(helper.make_node("Identity", [f"{prefix}_axis"], [begin]))
        nodes.append(helper.make_node("Add", [rank, f"{prefix}_axis"], [end]))
    else:
        nodes.append(helper.make_node("Add", [rank, f"{prefix}_axis"], [begin]))
        nodes.append(helper.make_node("Add", [f"{prefix}_pads_size", f"{prefix}_axis"], [end]))
    nodes.append(helper.make_node("Concat", [begin, end], [f"{prefix}_indices"], axis=0))
    # groups of [fills before, tensor, fills after]: fills before the first tensor pad its beginning
    groups: list[tuple[list[onnx.NodeProto], str, list[onnx.NodeProto]]] = []
    leading: list[onnx.NodeProto] = []
    for name, producer in zip(node.input, fills, strict=True):
        if producer is None:
            groups.append((leading if not groups else [], name, []))
        elif groups:
            groups[-1][2].append(producer)
        else:
            leading.append(producer)
    parts = []
    for index, (before, name, after) in enumerate(groups):
        if not before and not after:
            parts.append(name)
            continue
        group = f"{prefix}{index}"
        sizes = [
            _size(nodes, side_fills, f"{group}_{side}", prefix)
            for side, side_fills in (("begin", before), ("end", after))
        ]
        nodes.append(helper.make_node("Concat", sizes, [f"{group}_sizes"], axis=0))
        nodes.append(
            helper.make_node(
                "ScatterElements",
                [f"{prefix}_no_pads", f"{prefix}_indices", f"{group}_sizes"],
                [f"{group}_pads"],
                axis=0,
            )
        )
        padded = output if len(groups) == 1 else f"{group}_padded"
        nodes.append(helper.make_node("Pad", [name, f"{group}_pads", f"{prefix}_value"], [padded], mode="constant"))
        parts.append(padded)
    if len(groups) > 1:
        nodes.append(helper.make_node("Concat", parts, [output], name=node.name, axis=axis))
    return nodes


def _size(nodes: list[onnx.NodeProto], fills: list[onnx.NodeProto], name: str, prefix: str) -> str:
    """Append nodes computing the fills' total size along the axis (a 1-element tensor); return its name."""
    total = f"{prefix}_zero"
    for index, fill in enumerate(fills):
        size = f"{name}{index}"
        nodes.append(helper.make_node("Gather", [fill.input[0], f"{prefix}_axis"], [size], axis=0))
        if index:
            nodes.append(helper.make_node("Add", [total, size], [f"{size}_total"]))
            size = f"{size}_total"
        total = size
    return total


def _fill_value(fill: onnx.NodeProto) -> np.ndarray:
    """The value a ``ConstantOfShape`` node fills with (a float 0 without its ``value`` attribute)."""
    value = next((attribute for attribute in fill.attribute if attribute.name == "value"), None)
    return numpy_helper.to_array(value.t) if value is not None else np.zeros(1, dtype=np.float32)


def _ints(values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64))
