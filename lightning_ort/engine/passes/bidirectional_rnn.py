"""Bidirectional ``LSTM``/``GRU`` nodes split into two forward ones that ORT can train.

torch exports ``nn.LSTM(bidirectional=True)`` (and ``nn.GRU``) as one ONNX node per layer with
``direction="bidirectional"``. ORT 1.19.2's training kernels (``LSTMTraining``,
``GRUTraining`` and their gradients) only run the forward direction and refuse such a node when the
session starts. :func:`split_bidirectional_rnns` rewrites each one, after the export, into what it
computes by definition:

- a forward node over the same input, with the direction-0 slices of its weights and initial states;
- a forward node over the input reversed in time, with the direction-1 slices, whose output sequence
  is reversed back;
- their outputs concatenated on the direction axis, under the original node's output names.

Weights and states are cut with ``Slice`` and time is reversed with ``Slice(steps=-1)``; ORT has
gradients for both (``SliceGrad``) and for ``Concat``. ``RNN`` nodes are left alone: ORT has no
gradient for ``RNN`` in either direction.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

_RNN_OPS = ("LSTM", "GRU")
# Inputs of one direction each, by position: W, R, B, initial_h (5), and LSTM's initial_c (6) and P (7).
_PER_DIRECTION_INPUTS = (1, 2, 3, 5, 6, 7)
_STATE_INPUTS = (5, 6)
_SEQUENCE_LENS = 4
_INT64_MIN = np.iinfo(np.int64).min


def split_bidirectional_rnns(model: onnx.ModelProto) -> int:
    """Rewrite ``model``'s bidirectional ``LSTM``/``GRU`` nodes into two forward-direction
    nodes each (in place); how many were rewritten.

    A node is left as it is when it has a ``sequence_lens`` input (each sequence would have to be
    reversed within its own length, with ``ReverseSequence``, for which ORT has no gradient) or
    ``activation_alpha``/``activation_beta`` attributes (which activations consume them is
    ambiguous; torch never exports them). Running it again on its own result changes nothing."""
    graph = model.graph
    used = {name for node in graph.node for name in node.input} | {output.name for output in graph.output}
    nodes: list[onnx.NodeProto] = []
    count = 0
    for node in graph.node:
        replacement = _split(node, used) if _is_bidirectional_rnn(node) else None
        if replacement is None:
            nodes.append(node)
        else:
            nodes.extend(replacement)
            count += 1
    if count:
        del graph.node[:]
        graph.node.extend(nodes)
    return count


def _is_bidirectional_rnn(node: onnx.NodeProto) -> bool:
    return (
        node.op_type in _RNN_OPS
        and node.domain in ("", "ai.onnx")
        and any(attribute.name == "direction" and attribute.s == b"bidirectional" for attribute in node.attribute)
    )


def _split(node: onnx.NodeProto, used: set[str]) -> list[onnx.NodeProto] | None:
    """The nodes computing ``node`` with two forward-direction nodes, or None to keep it."""
    attributes = {attribute.name: attribute for attribute in node.attribute}
    if len(node.input) > _SEQUENCE_LENS and node.input[_SEQUENCE_LENS]:
        return None
    if "activation_alpha" in attributes or "activation_beta" in attributes:
        return None
    outputs = [name if name in used else "" for name in node.output]
    if not any(outputs):
        return None
    batch_major = "layout" in attributes and attributes["layout"].i == 1
    time_axis, direction_axis = (1, 2) if batch_major else (0, 1)  # of X and Y
    state_direction_axis = 1 if batch_major else 0  # of initial/final states
    prefix = f"{node.name or next(name for name in node.output if name)}/lightning_ort_direction"
    nodes = [
        _constant(f"{prefix}_reverse_starts", [-1]),
        _constant(f"{prefix}_reverse_ends", [_INT64_MIN]),
        _constant(f"{prefix}_reverse_steps", [-1]),
        _constant(f"{prefix}_time_axis", [time_axis]),
        _constant(f"{prefix}_axis", [0]),
        _constant(f"{prefix}_state_axis", [state_direction_axis]),
    ]

    def reverse(source: str, target: str) -> onnx.NodeProto:
        return helper.make_node(
            "Slice",
            [source, f"{prefix}_reverse_starts", f"{prefix}_reverse_ends", f"{prefix}_time_axis",
             f"{prefix}_reverse_steps"],
            [target], name=f"{target}/reverse",
        )  # fmt: skip

    halves: list[list[str]] = []
    for direction in (0, 1):
        half = f"{prefix}{direction}"
        nodes += [_constant(f"{half}_starts", [direction]), _constant(f"{half}_ends", [direction + 1])]
        inputs = list(node.input)
        if direction == 1:
            inputs[0] = f"{half}_X"
            nodes.append(reverse(node.input[0], inputs[0]))
        for index in _PER_DIRECTION_INPUTS:
            if index < len(inputs) and inputs[index]:
                axis = f"{prefix}_state_axis" if index in _STATE_INPUTS else f"{prefix}_axis"
                inputs[index] = f"{half}_input{index}"
                nodes.append(
                    helper.make_node(
                        "Slice",
                        [node.input[index], f"{half}_starts", f"{half}_ends", axis],
                        [inputs[index]],
                        name=f"{half}/slice_{index}",
                    )
                )
        half_outputs = [f"{half}_output{index}" if name else "" for index, name in enumerate(outputs)]
        last = max(index for index, name in enumerate(half_outputs) if name)
        rnn = helper.make_node(node.op_type, inputs, half_outputs[: last + 1], name=half, domain=node.domain)
        rnn.attribute.extend(_half_attributes(node, direction))
        nodes.append(rnn)
        if direction == 1 and half_outputs[0]:
            nodes.append(reverse(half_outputs[0], f"{half}_Y"))
            half_outputs[0] = f"{half}_Y"
        halves.append(half_outputs)
    for index, name in enumerate(outputs):
        if name:
            axis = direction_axis if index == 0 else state_direction_axis
            nodes.append(
                helper.make_node(
                    "Concat", [halves[0][index], halves[1][index]], [name], name=f"{prefix}/concat_{index}", axis=axis
                )
            )
    read = {name for new in nodes for name in new.input}
    return [new for new in nodes if new.op_type != "Constant" or new.output[0] in read]


def _half_attributes(node: onnx.NodeProto, direction: int) -> list[onnx.AttributeProto]:
    """``node``'s attributes for one direction run forward: its half of ``activations``, the rest as is."""
    attributes = []
    for attribute in node.attribute:
        if attribute.name == "direction":
            attributes.append(helper.make_attribute("direction", "forward"))
        elif attribute.name == "activations":
            half = len(attribute.strings) // 2
            strings = attribute.strings[half * direction : half * (direction + 1)]
            attributes.append(helper.make_attribute("activations", [s.decode() for s in strings]))
        else:
            copy = onnx.AttributeProto()
            copy.CopyFrom(attribute)
            attributes.append(copy)
    return attributes


def _constant(name: str, values: list[int]) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], name=f"{name}/constant", value=numpy_helper.from_array(np.array(values, np.int64))
    )
