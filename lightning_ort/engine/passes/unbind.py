"""Attention's q/k/v split as one torch copy each way (part of ``op_rewrites``).

A packed projection is split into its parts in one of two exported forms:

- ``qkv.view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)`` and ``q, k, v = qkv[0], qkv[1], qkv[2]`` (the GPT
  example, nanoGPT-style code), or the same indexing without the permute (``nn.MultiheadAttention``'s
  packed in-projection as mha_export.py exports it): a ``Slice`` + ``Squeeze`` per part (and the
  ``Transpose``), which ORT turns into a ``Split`` followed by a ``Transpose`` of every part, and a
  ``Concat`` and ``Transpose`` in the backward pass;
- ``linear(x).chunk(3, dim=-1)`` with sizes the export holds as constants: a ``Split`` of the last
  dimension, and a ``Concat`` in the backward pass.

ORT's ``Split``, ``Concat`` and ``Transpose`` run on one thread; together they cost 1.4 ms per GPT
layer per step on 2 cores, and torch's parallel copies of the same data about a tenth of that (hot
cache). :func:`fuse_unbinds` rewrites both forms, after the export, into one ATen node,
``lightning_ort::unbind2`` or ``unbind3`` (``csrc/unbind.cc``): ``x.permute(perm).unbind(dim)``,
each part made contiguous, with a gradient that writes the parts' gradients straight into ``x``'s
layout (zeros for a part without one, such as a detached key). Values are copies, as in eager.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from lightning_ort.engine.ops.kernels.gradient_overloads import aten_operator, register_simple_gradient
from lightning_ort.engine.passes.graph_rewrite import GraphRewrite, has_subgraphs

_OPERATORS = {2: "lightning_ort::unbind2", 3: "lightning_ort::unbind3"}
_INT64_MAX = np.iinfo(np.int64).max


def fuse_unbinds(model: onnx.ModelProto) -> int:
    """Rewrite ``model``'s packed splits into ``lightning_ort::unbind*`` nodes (in place); how many.

    Running it again on its own result changes nothing."""
    graph = model.graph
    if has_subgraphs(graph):
        return 0  # control flow could read the tensors this pass removes
    rewrite = _Rewrite(graph)
    for node in list(graph.node):
        if _is_onnx(node, "Split"):
            rewrite.last_dim_split(node)
        else:
            rewrite.selects(node)
    return rewrite.finish()


def _is_onnx(node: onnx.NodeProto, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in ("", "ai.onnx")


class _Rewrite(GraphRewrite):
    """The graph indexed, and the packed splits replaced so far."""

    def selects(self, node: onnx.NodeProto) -> None:
        """``node``'s output taken apart at every index of one axis (``Slice`` + ``Squeeze`` each),
        by its only users; a ``Transpose`` producing it is folded in."""
        tensor = node.output[0] if node.output else ""
        slices = self.users.get(tensor, [])
        parts = len(slices)
        if tensor in self.outputs or parts not in _OPERATORS or any(user.op_type != "Slice" for user in slices):
            return
        if _is_onnx(node, "Transpose"):
            perm = next((list(attribute.ints) for attribute in node.attribute if attribute.name == "perm"), None)
            source, removed = node.input[0], [node]
        else:
            rank = len(self.shapes[tensor]) if tensor in self.shapes else None
            perm = list(range(rank)) if rank is not None else None
            source, removed = tensor, []
        if perm is None:
            return
        selected: dict[int, onnx.NodeProto] = {}
        axis = None
        for user in slices:
            found = self._select(user, len(perm))
            if found is None:
                return
            user_axis, index, squeeze = found
            if axis not in (None, user_axis) or not -parts <= index < parts:
                return
            axis = user_axis
            selected[index % parts] = squeeze
        if axis is None or sorted(selected) != list(range(parts)) or self.dim(source, perm[axis]) != parts:
            return
        removed += [*slices, *selected.values()]
        self._replace(removed, source, perm, axis, [selected[index].output[0] for index in range(parts)], [])

    def last_dim_split(self, split: onnx.NodeProto) -> None:
        """``Split`` of the last dimension into 2 or 3 equal parts."""
        source = split.input[0]
        rank = len(self.shapes[source]) if source in self.shapes else None
        parts = len(split.output)
        if rank is None or parts not in _OPERATORS or any(name in self.outputs for name in split.output):
            return
        attributes = {attribute.name: attribute for attribute in split.attribute}
        axis = attributes["axis"].i if "axis" in attributes else 0
        if axis % rank != rank - 1:
            return
        sizes = None
        if len(split.input) > 1 and split.input[1]:
            sizes = self.constants.get(split.input[1])
            if sizes is None:
                return
            sizes = [int(size) for size in sizes.reshape(-1)]
        elif "split" in attributes:
            sizes = list(attributes["split"].ints)
        if sizes is not None and (len(sizes) != parts or len(set(sizes)) != 1):
            return
        last = self.dim(source, rank - 1)
        if sizes is None and (last is None or last % parts):
            return  # equal parts (num_outputs) need a length that divides
        name = f"{split.name or split.output[0]}/lightning_ort_packed"
        size = sizes[0] if sizes is not None else last // parts  # not -1: it is unknown for an empty tensor
        shape = helper.make_node(
            "Constant", [], [f"{name}_shape"], name=f"{name}/shape",
            value=numpy_helper.from_array(np.array([0] * (rank - 1) + [parts, size], dtype=np.int64)),
        )  # fmt: skip
        packed = helper.make_node("Reshape", [source, f"{name}_shape"], [name], name=f"{name}/reshape")
        self._replace([split], name, list(range(rank + 1)), rank - 1, list(split.output), [shape, packed])

    def _select(self, node: onnx.NodeProto, rank: int) -> tuple[int, int, onnx.NodeProto] | None:
        """(axis, index, its Squeeze) when ``node`` is ``x[..., index, ...]`` as ``Slice`` + ``Squeeze``."""
        if node.op_type != "Slice" or len(node.input) < 4:
            return None
        starts, ends, axes = (self.constants.get(name) for name in node.input[1:4])
        steps = self.constants.get(node.input[4]) if len(node.input) > 4 and node.input[4] else np.array([1])
        if any(value is None or value.size != 1 for value in (starts, ends, axes, steps)) or int(steps[0]) != 1:
            return None
        axis, start, end = int(axes[0]) % rank, int(starts[0]), int(ends[0])
        if not (start + 1 == end or (start == -1 and end == _INT64_MAX)):
            return None
        squeezes = self.users.get(node.output[0], [])
        if node.output[0] in self.outputs or len(squeezes) != 1 or squeezes[0].op_type != "Squeeze":
            return None
        squeeze = squeezes[0]
        squeezed = self.constants.get(squeeze.input[1]) if len(squeeze.input) > 1 else None
        if squeezed is None:
            attribute = next((a for a in squeeze.attribute if a.name == "axes"), None)
            squeezed = np.array(attribute.ints) if attribute is not None else None
        if squeezed is None or squeezed.size != 1 or int(squeezed[0]) % rank != axis:
            return None
        return axis, start, squeeze

    def _replace(
        self,
        removed: list[onnx.NodeProto],
        source: str,
        perm: list[int],
        axis: int,
        outputs: list[str],
        prefix: list[onnx.NodeProto],
    ) -> None:
        name = f"{removed[0].name or outputs[0]}/lightning_ort_unbind"
        perm_node = helper.make_node(
            "Constant", [], [f"{name}_perm"], name=f"{name}/perm",
            value=numpy_helper.from_array(np.array(perm, dtype=np.int64)),
        )  # fmt: skip
        dim_node = helper.make_node(
            "Constant", [], [f"{name}_dim"], name=f"{name}/dim", value=numpy_helper.from_array(np.array(axis))
        )
        unbind = helper.make_node(
            "ATen", [source, f"{name}_perm", f"{name}_dim"], outputs, name=name, domain="org.pytorch.aten",
            operator=_OPERATORS[len(outputs)],
        )  # fmt: skip
        self.replace(removed, [*prefix, perm_node, dim_node, unbind])


def drop_missing_gradients(graph: onnx.GraphProto) -> None:
    """Leave out the inputs of ``unbind*_backward`` nodes that name a gradient ORT did not build (a
    part that needs none, such as a detached key): the operator takes zeros for them."""
    backward = {f"{operator}_backward" for operator in _OPERATORS.values()}
    defined = {name for node in graph.node for name in node.output}
    defined.update(info.name for info in graph.input)
    defined.update(initializer.name for initializer in graph.initializer)
    for node in graph.node:
        if aten_operator(node) in backward:
            for index in range(len(node.input) - 3):  # the parts' gradients come first
                if node.input[index] not in defined:
                    node.input[index] = ""


def register_gradients() -> None:
    """Give ORT's gradient builder the gradients of ``lightning_ort::unbind2``/``unbind3`` (process-wide)."""
    from onnxruntime.training.ortmodule.graph_optimizer_registry import GraphOptimizerRegistry

    for parts, operator in _OPERATORS.items():
        grads = [f"GO({index})" for index in range(parts)]
        register_simple_gradient(operator, f"{operator}_backward", [*grads, "O(0)", "I(1)", "I(2)"])
    GraphOptimizerRegistry.register("all", "all", 0, drop_missing_gradients)
