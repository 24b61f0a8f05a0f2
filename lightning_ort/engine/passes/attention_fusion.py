"""Attention written out by hand, fused into torch's attention kernels (``ORTStrategy(fuse_attention=True)``).

Models often spell attention out, as the GPT example and nanoGPT-style code do::

    scores = (q @ k.transpose(-2, -1)) * scale        # or / math.sqrt(d), or no scale
    scores = scores.masked_fill(~mask, float("-inf"))  # optional
    out = dropout(softmax(scores, dim=-1)) @ v         # dropout optional, only with p=0

Eager PyTorch runs it as five kernels forward and five backward, writing the (batch, heads,
length, length) scores several times. That is ``scaled_dot_product_attention(q, k, v,
attn_mask=mask, scale=scale)``, whose CPU flash-attention kernels compute it in blocks.
:func:`fuse_attention` rewrites the exported graph's ``lightning_ort::matmul``, ``Mul``/``Div``,
``lightning_ort::masked_fill``, ``lightning_ort::softmax`` (and p=0 ``Dropout``) chain into one
``lightning_ort::attention`` node (torch_kernels.py), which picks the kernels eager's
``scaled_dot_product_attention`` would. Results equal eager's to float rounding (the flash kernels
sum in another order), not bit for bit.

Only a chain whose intermediate results nothing else reads is fused, with a scale that is a
constant, a fill of -inf and a softmax over the last dimension; anything else keeps the five
nodes. A query row whose keys are all masked is NaN in eager; the fused kernels give it zeros. It
needs ``op_rewrites`` (the matmul, masked_fill and softmax nodes are theirs).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from lightning_ort.engine.ops.kernels.gradient_overloads import GRAD_DOMAIN, aten_operator
from lightning_ort.engine.passes.graph_rewrite import GraphRewrite, has_subgraphs

_MATMUL = "lightning_ort::matmul"
_SOFTMAX = "lightning_ort::softmax"
_MASKED_FILL = "lightning_ort::masked_fill"
_ATTENTION = "lightning_ort::attention"
_UNBIND3 = "lightning_ort::unbind3"
_HEADS_FIRST = [2, 0, 3, 1, 4]  # (batch, length, 3, heads, dim) -> (3, batch, heads, length, dim)
_HEADS_SECOND = [2, 0, 1, 3, 4]  # -> (3, batch, length, heads, dim)
_SWAP_HEADS = [0, 2, 1, 3]


def fuse_attention(model: onnx.ModelProto) -> int:
    """Rewrite ``model``'s attention written out by hand into ``lightning_ort::attention`` nodes (in
    place); how many."""
    graph = model.graph
    if has_subgraphs(graph):
        return 0  # control flow could read the tensors this pass removes
    rewrite = _AttentionRewrite(graph)
    for node in list(graph.node):
        if aten_operator(node) == _MATMUL:
            rewrite.attention(node)
    return rewrite.finish()


class _AttentionRewrite(GraphRewrite):
    """The graph indexed, and the attention chains fused so far."""

    def attention(self, output_matmul: onnx.NodeProto) -> None:
        """Fuse the chain that ends in ``output_matmul`` (``weights @ v``), when it is attention."""
        weights, value = output_matmul.input[0], output_matmul.input[1]
        if self._flags(output_matmul) != (False, False):
            return
        chain = [output_matmul]
        producer = self._single_use_producer(weights)
        if producer is not None and producer.op_type == "Dropout" and self._is_identity_dropout(producer):
            chain.append(producer)
            producer = self._single_use_producer(producer.input[0])
        if producer is None or aten_operator(producer) != _SOFTMAX or not self._over_last_dim(producer):
            return
        chain.append(producer)
        mask = ""
        producer = self._single_use_producer(producer.input[0])
        if producer is not None and aten_operator(producer) == _MASKED_FILL:
            fill = self.scalar(producer.input[2])
            if fill is None or fill != -math.inf:
                return
            chain.append(producer)
            mask = producer.input[1]
            producer = self._filled_scores_producer(producer)
        scale = 1.0
        if producer is not None and producer.op_type in ("Mul", "Div") and producer.domain in ("", "ai.onnx"):
            found = self._scaled(producer)
            if found is None:
                return
            scale, scores = found
            chain.append(producer)
            producer = self._single_use_producer(scores)
        if producer is None or aten_operator(producer) != _MATMUL or self._flags(producer) != (False, True):
            return
        chain.append(producer)
        query, key = producer.input[0], producer.input[1]
        output, heads_second = output_matmul.output[0], self._heads_second(query, key, value, output_matmul.output[0])
        if heads_second is not None:
            chain.append(heads_second[1])
            output = heads_second[1].output[0]
        nodes = self._attention_nodes(output, query, key, value, mask, scale, heads_second is not None)
        if not self.replace(chain, nodes):
            return
        rank = len(self.shapes[query]) if query in self.shapes else None
        shape = None if rank is None else [None] * (rank - 1)  # (batch, heads, length)
        self.graph.value_info.append(helper.make_tensor_value_info(nodes[-1].output[1], onnx.TensorProto.FLOAT, shape))
        if heads_second is not None:
            self._split_heads_second(heads_second[0])

    def _heads_second(
        self, query: str, key: str, value: str, output: str
    ) -> tuple[onnx.NodeProto, onnx.NodeProto] | None:
        """(the split, the transpose) when ``query``, ``key`` and ``value`` are the parts of one packed
        projection split into (batch, heads, length, dim) tensors (``qkv.view(B, T, 3, H, D).permute(2,
        0, 3, 1, 4)``, unbind.py) and ``output`` is only read by its ``transpose(1, 2)``.

        The attention kernels take (batch, length, heads, dim) tensors as views and write their output
        in that layout, so the split can leave out its transpose and the output's goes: two copies
        fewer forward, and as many backward."""
        split = self.producers.get(query)
        if split is None or aten_operator(split) != _UNBIND3 or list(split.output) != [query, key, value]:
            return None
        perm, perm_node = self.constants.get(split.input[1]), self.producers.get(split.input[1])
        if perm is None or perm.tolist() != _HEADS_FIRST or self.scalar(split.input[2]) != 0:
            return None
        if perm_node is None or perm_node.op_type != "Constant" or self.only_user(split.input[1]) is not split:
            return None
        if any(self.only_user(name) is None for name in (query, key, value)):
            return None
        transpose = self.only_user(output)
        if transpose is None or transpose.op_type != "Transpose" or transpose.domain not in ("", "ai.onnx"):
            return None
        perms = [list(attribute.ints) for attribute in transpose.attribute if attribute.name == "perm"]
        return (split, transpose) if perms == [_SWAP_HEADS] else None

    def _split_heads_second(self, split: onnx.NodeProto) -> None:
        """Make ``split`` give (batch, length, heads, dim) parts, and say so in the graph's shapes."""
        perm_node = self.producers[split.input[1]]
        perm_node.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array(_HEADS_SECOND, dtype=np.int64)))
        parts = set(split.output)
        for info in self.graph.value_info:
            dims = info.type.tensor_type.shape.dim
            if info.name in parts and len(dims) == 4:
                second, third = onnx.TensorShapeProto.Dimension(), onnx.TensorShapeProto.Dimension()
                second.CopyFrom(dims[2])
                third.CopyFrom(dims[1])
                dims[1].CopyFrom(second)
                dims[2].CopyFrom(third)

    def _single_use_producer(self, name: str) -> onnx.NodeProto | None:
        """The node computing ``name`` when ``name`` is read by one node only (the next in the chain)."""
        return self.producers.get(name) if self.only_user(name) is not None else None

    def _filled_scores_producer(self, masked_fill: onnx.NodeProto) -> onnx.NodeProto | None:
        """The node computing the scores ``masked_fill`` fills, when only it and the ``Shape`` of its
        own size argument read them."""
        scores = masked_fill.input[0]
        users = self.users.get(scores, [])
        sizes = [user for user in users if user.op_type == "Shape" and user.output[0] == masked_fill.input[3]]
        if scores in self.outputs or len(users) != 1 + len(sizes) or masked_fill not in users:
            return None
        if any(self.only_user(shape.output[0]) is not masked_fill for shape in sizes):
            return None
        return self.producers.get(scores)

    def _flags(self, matmul: onnx.NodeProto) -> tuple[bool, bool] | None:
        """A ``lightning_ort::matmul``'s (self given transposed, other given transposed)."""
        flags = [self.scalar(name) for name in matmul.input[2:4]]
        if len(flags) != 2 or None in flags:
            return None
        return bool(flags[0]), bool(flags[1])

    def _is_identity_dropout(self, dropout: onnx.NodeProto) -> bool:
        """A ``Dropout`` with ratio 0 (``nn.Dropout(0.0)`` in training) whose mask nobody reads."""
        ratio = self.scalar(dropout.input[1]) if len(dropout.input) > 1 and dropout.input[1] else None
        mask_read = len(dropout.output) > 1 and bool(self.users.get(dropout.output[1]))
        return ratio == 0.0 and not mask_read

    def _over_last_dim(self, softmax: onnx.NodeProto) -> bool:
        dim = self.scalar(softmax.input[1]) if len(softmax.input) > 1 else None
        rank = len(self.shapes[softmax.input[0]]) if softmax.input[0] in self.shapes else None
        return dim is not None and (dim == -1 or (rank is not None and dim == rank - 1))

    def _scaled(self, node: onnx.NodeProto) -> tuple[float, str] | None:
        """(scale, scores) for ``scores * c``, ``c * scores`` or ``scores / c`` with a constant ``c``."""
        first, second = self.constants.get(node.input[0]), self.constants.get(node.input[1])
        if node.op_type == "Mul" and (first is None) != (second is None):
            constant, scores = (second, node.input[0]) if first is None else (first, node.input[1])
        elif node.op_type == "Div" and first is None and second is not None:
            constant, scores = second, node.input[0]
        else:
            return None
        if constant.size != 1 or not np.issubdtype(constant.dtype, np.floating):
            return None
        factor = float(constant.reshape(-1)[0])
        if not math.isfinite(factor) or factor == 0.0:
            return None
        return (factor if node.op_type == "Mul" else 1.0 / factor), scores

    def _attention_nodes(
        self, output: str, query: str, key: str, value: str, fill_mask: str, scale: float, transposed: bool
    ) -> list[onnx.NodeProto]:
        """``lightning_ort::attention`` computing ``output``, and its constant inputs."""
        name = f"{output}/lightning_ort_attention"

        def constant(suffix: str, array: np.ndarray) -> onnx.NodeProto:
            return helper.make_node(
                "Constant", [], [f"{name}_{suffix}"], name=f"{name}/{suffix}", value=numpy_helper.from_array(array)
            )

        nodes = [
            constant("scale", np.array(scale, dtype=np.float32)),
            constant("is_causal", np.array(False)),
            constant("transposed", np.array(transposed)),
        ]
        mask = ""
        if fill_mask:  # masked_fill's mask is True where the score is dropped, attention's where it is kept
            mask = f"{name}_mask"
            nodes.append(helper.make_node("Not", [fill_mask], [mask], name=f"{name}/mask"))
        inputs = [query, key, value, mask, *(node.output[0] for node in nodes[:3])]
        outputs = [output, f"{name}_logsumexp"]
        nodes.append(helper.make_node("ATen", inputs, outputs, name=name, domain=GRAD_DOMAIN, operator=_ATTENTION))
        return nodes
