"""Channels-last (NHWC) activations for 2-D convolution networks inside ORT's graph (part of ``op_rewrites``).

torch's CPU kernels for convolutions, BatchNorm and pooling run 1.1-5x faster on tensors in
``torch.channels_last`` memory than on standard (N, C, H, W) ones (``benchmarks/NOTES.md``), but ORT
tensors have no strides: a graph holds whatever shape it is given, contiguously. So after the export,
:func:`to_channels_last` rewrites the forward graph (ORT differentiates the result):

- the 2-D convolutions, BatchNorms, GroupNorms, poolings and nearest and bilinear upsamplings that run
  torch's kernels take and return (N, H, W, C) tensors (the ``*_nhwc`` operators of
  ``csrc/channels_last.cc``, which see them as channels-last (N, C, H, W) views);
- element-wise nodes between them (activations, residual additions, dropout) work on those tensors
  as they are, since the same permutation of both operands keeps broadcasting's meaning, and
  concatenations (of channels, as in U-Nets) take the permuted axis;
- a ``Transpose`` converts where a tensor enters this region, and converts back where it leaves
  (a ``Flatten``, a ``Reshape``, a graph output); a model's own permutes between the two layouts
  (ConvNeXt's) become the tensors already held, and ``Shape``/``Size`` read the held tensor.

Results equal eager's up to float rounding: the channels-last kernels sum in another order.

Over 300 lines because the rewrite is one walk over the graph (:class:`_Rewrite`) that decides, node by
node, which tensors are held channels-last; its cases share that state.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import onnx
import onnx.numpy_helper

from lightning_ort.engine.ops import registry
from lightning_ort.engine.ops.kernels.batchnorm import register_batch_norm_gradient
from lightning_ort.engine.ops.kernels.gradient_overloads import (
    aten_operator,
    register_gradient,
    register_simple_gradient,
)
from lightning_ort.engine.ops.kernels.torch_kernels import register_convolution_gradients

TO_NHWC = [0, 2, 3, 1]
TO_NCHW = [0, 3, 1, 2]
# operator -> its channels-last form and the outputs that form returns as (N, H, W, C)
NHWC_FORMS = {
    "lightning_ort::convolution": ("lightning_ort::convolution_nhwc", (0,)),
    "lightning_ort::convolution_bias": ("lightning_ort::convolution_bias_nhwc", (0,)),
    "lightning_ort::batch_norm": ("lightning_ort::batch_norm_nhwc", (0,)),
    "max_pool2d_with_indices": ("lightning_ort::max_pool2d_nhwc", (0, 1)),  # ORT's symbolic
    "avg_pool2d": ("lightning_ort::avg_pool2d_nhwc", (0,)),  # ORT's symbolic
    "_adaptive_avg_pool2d": ("lightning_ort::adaptive_avg_pool2d_nhwc", (0,)),  # ORT's symbolic
    "lightning_ort::upsample_nearest": ("lightning_ort::upsample_nearest2d_nhwc", (0,)),  # upsample.py
    "lightning_ort::upsample_linear": ("lightning_ort::upsample_bilinear2d_nhwc", (0,)),  # upsample.py
    "lightning_ort::group_norm_affine": ("lightning_ort::group_norm_nhwc", (0,)),  # layers.py
}
# Nodes whose every output is computed element by element from their inputs (with broadcasting)
ELEMENTWISE = {
    "Abs", "Add", "Cast", "Clip", "Div", "Dropout", "Elu", "Erf", "Exp", "HardSigmoid", "HardSwish", "Identity",
    "LeakyRelu", "Log", "Max", "Min", "Mul", "Neg", "Pow", "Relu", "Selu", "Sigmoid", "Softplus", "Sqrt", "Sub",
    "Tanh", "Where",
}  # fmt: skip
ELEMENTWISE_OPERATORS = set(registry.elementwise_operators())


def to_channels_last(model: onnx.ModelProto) -> int:
    """Rewrite ``model``'s 2-D convolution layers to channels-last forms (in place); the number rewritten.

    Running it again on its own result changes nothing.
    """
    graph = model.graph
    if any(attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for node in graph.node
           for attribute in node.attribute):  # fmt: skip
        return 0  # control flow could read a tensor this pass renames
    rewrite = _Rewrite(graph)
    # visiting edits the nodes in place, so a graph without a layer to convert is left unvisited
    if not any(rewrite.nhwc_form(node) for node in graph.node):
        return 0
    for node in list(graph.node):
        rewrite.visit(node)
    rewrite.finish()
    return rewrite.converted


class _Rewrite:
    """One pass over a graph in topological order, holding which tensors are (N, H, W, C) now."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.types: dict[str, onnx.TypeProto] = {}
        for info in [*graph.input, *graph.value_info, *graph.output]:
            self.types[info.name] = info.type
        for initializer in graph.initializer:
            self.types[initializer.name] = onnx.helper.make_tensor_type_proto(initializer.data_type, initializer.dims)
        # values of the graph's constants (a convolution's stride)
        self.constants: dict[str, list[Any]] = {
            initializer.name: onnx.numpy_helper.to_array(initializer).reshape(-1).tolist()
            for initializer in graph.initializer
            if len(initializer.dims) <= 1
        }
        for node in graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.constants[node.output[0]] = onnx.numpy_helper.to_array(node.attribute[0].t).reshape(-1).tolist()
        self.names = {name for node in graph.node for name in [*node.input, *node.output]} | set(self.types)
        self.nhwc: dict[str, str] = {}  # a tensor's name -> the name of its (N, H, W, C) form
        self.renamed: set[str] = set()  # outputs that now come out in (N, H, W, C) under another name
        self.nchw: set[str] = set()  # tensors whose standard form a Transpose back produces
        self.alias: dict[str, str] = {}  # a user's permute to (N, H, W, C) -> the tensor already held so
        self.nodes: list[onnx.NodeProto] = []
        self.converted = 0

    def visit(self, node: onnx.NodeProto) -> None:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    self.types[node.output[0]] = onnx.helper.make_tensor_type_proto(
                        attribute.t.data_type, attribute.t.dims
                    )
        for index, name in enumerate(node.input):
            node.input[index] = self.alias.get(name, name)
        if self._permutes_layout(node) or self._shape_of_held(node):
            return
        form = self.nhwc_form(node)
        if form is not None:
            operator, outputs = form
            _set_operator(node, operator)
            node.input[0] = self._nhwc_name(node.input[0])
            self._hold_outputs(node, outputs)
            self.converted += 1
        elif _is_onnx(node, "Concat") and self._all_in_nhwc(node):
            for index, name in enumerate(node.input):
                node.input[index] = self._nhwc_name(name)
            axis = next(attribute for attribute in node.attribute if attribute.name == "axis")
            axis.i = TO_NHWC.index(axis.i % 4)
            self._hold_outputs(node, [0])
        elif _is_elementwise(node) and self._elementwise_in_nhwc(node):
            for index, name in enumerate(node.input):
                if name in self.nhwc or (name and self._rank(name) == 4 and not self._all_ones(name)):
                    node.input[index] = self._nhwc_name(name)
            self._hold_outputs(node, range(len(node.output)))
        else:
            for name in node.input:
                if name in self.nhwc:
                    self._back_to_nchw(name)
        self.nodes.append(node)

    def finish(self) -> None:
        for output in self.graph.output:
            if output.name in self.alias:
                self.nodes.append(onnx.helper.make_node("Identity", [self.alias[output.name]], [output.name]))
            elif output.name in self.nhwc:
                self._back_to_nchw(output.name)
        gone = self.renamed - self.nchw
        kept = [info for info in self.graph.value_info if info.name not in gone]
        del self.graph.value_info[:]
        self.graph.value_info.extend(kept)
        del self.graph.node[:]
        self.graph.node.extend(self.nodes)

    def nhwc_form(self, node: onnx.NodeProto) -> tuple[str, tuple[int, ...]] | None:
        """The channels-last form of ``node`` if it is a 2-D layer this pass converts."""
        form = _nhwc_form(node)
        if form is None or self._rank(node.input[0]) != 4 or self._strided_pointwise(node):
            return None
        return form

    def _strided_pointwise(self, node: onnx.NodeProto) -> bool:
        """A 1x1 convolution with a stride (ResNet's downsampling shortcut): torch's channels-last backward
        corrupted the heap for it (SIGSEGV or glibc's "corrupted size vs. prev_size" on even image sizes),
        so it stays in the standard layout."""
        operator = aten_operator(node)
        if operator not in ("lightning_ort::convolution", "lightning_ort::convolution_bias"):
            return False
        position = 3 if operator.endswith("_bias") else 2
        weight = self.types.get(node.input[1]) if len(node.input) > position else None
        if weight is None or not weight.tensor_type.HasField("shape"):
            return False
        kernel = [dim.dim_value if dim.HasField("dim_value") else None for dim in weight.tensor_type.shape.dim[2:]]
        stride = self.constants.get(node.input[position])
        return kernel == [1, 1] and (stride is None or any(int(step) != 1 for step in stride))

    def _permutes_layout(self, node: onnx.NodeProto) -> bool:
        """Absorb a user's own permute between the layouts (ConvNeXt's ``x.permute(0, 2, 3, 1)`` around
        its LayerNorm and linear layers), which would otherwise meet a Transpose of this pass.

        ``x.permute(0, 2, 3, 1)`` of a tensor held as (N, H, W, C) is that tensor; the result of
        ``y.permute(0, 3, 1, 2)`` is held as ``y``, and computed only if something needs it as it is.
        """
        if not _is_onnx(node, "Transpose"):
            return False
        perm = next((list(attribute.ints) for attribute in node.attribute if attribute.name == "perm"), None)
        source, result = node.input[0], node.output[0]
        if perm == TO_NHWC and source in self.nhwc:
            self.alias[result] = self.nhwc[source]
            self.renamed.add(result)
            return True
        if perm == TO_NCHW and source not in self.nhwc:
            self.nhwc[result] = source
            self.renamed.add(result)
            return True
        return False

    def _shape_of_held(self, node: onnx.NodeProto) -> bool:
        """``Shape`` of a tensor held as (N, H, W, C): the held tensor's shape, permuted; ``Size``: the held
        tensor's. No Transpose of the data for them (ORT's GroupNorm export reads N, C and H*W so)."""
        if not _is_onnx(node, "Shape", "Size") or node.attribute:
            return False
        source = node.input[0]
        if source not in self.nhwc or source in self.nchw:
            return False
        if node.op_type == "Size":
            node.input[0] = self.nhwc[source]
            self.nodes.append(node)
            return True
        held_shape = self._fresh(f"{node.output[0]}_nhwc")
        order = self._fresh(f"{node.output[0]}_order")
        self.nodes.append(onnx.helper.make_node("Shape", [self.nhwc[source]], [held_shape]))
        self.nodes.append(
            onnx.helper.make_node("Constant", [], [order], value=onnx.helper.make_tensor(order, 7, [4], TO_NCHW))
        )
        self.nodes.append(onnx.helper.make_node("Gather", [held_shape, order], [node.output[0]], axis=0))
        return True

    def _rank(self, name: str) -> int | None:
        tensor_type = self.types.get(name)
        if tensor_type is None or not tensor_type.HasField("tensor_type"):
            return None
        if not tensor_type.tensor_type.HasField("shape"):
            return None
        return len(tensor_type.tensor_type.shape.dim)

    def _all_ones(self, name: str) -> bool:
        tensor_type = self.types.get(name)
        if self._rank(name) is None or tensor_type is None:
            return False
        dims = tensor_type.tensor_type.shape.dim
        return len(dims) <= 4 and all(dim.HasField("dim_value") and dim.dim_value == 1 for dim in dims)

    def _elementwise_in_nhwc(self, node: onnx.NodeProto) -> bool:
        """Whether ``node`` can take its (N, H, W, C) inputs as they are: one of them is, and every other
        is a 4-D tensor (transposed too) or broadcasts the same way in either layout (a scalar)."""
        inputs = [name for name in node.input if name]
        return any(name in self.nhwc for name in inputs) and all(
            name in self.nhwc or self._rank(name) == 4 or self._all_ones(name) for name in inputs
        )

    def _all_in_nhwc(self, node: onnx.NodeProto) -> bool:
        """Whether one of ``node``'s inputs is (N, H, W, C) and all are 4-D (a concatenation)."""
        return any(name in self.nhwc for name in node.input) and all(
            name in self.nhwc or self._rank(name) == 4 for name in node.input
        )

    def _hold_outputs(self, node: onnx.NodeProto, indices: Iterable[int]) -> None:
        for index in indices:
            name = node.output[index]
            if not name:
                continue
            held = self._fresh(f"{name}_nhwc")
            node.output[index] = held
            self.nhwc[name] = held
            self.renamed.add(name)
            self._permuted_type(name, held, TO_NHWC)

    def _nhwc_name(self, name: str) -> str:
        """The (N, H, W, C) form of ``name``, transposing it here if it has none yet."""
        if name not in self.nhwc:
            held = self._fresh(f"{name}_nhwc")
            self.nodes.append(onnx.helper.make_node("Transpose", [name], [held], perm=TO_NHWC))
            self.nhwc[name] = held
            self.nchw.add(name)  # it keeps its standard form: a later reader must not define it again
            self._permuted_type(name, held, TO_NHWC)
        return self.nhwc[name]

    def _back_to_nchw(self, name: str) -> None:
        """Make ``name`` exist in its standard layout (a Transpose back from its (N, H, W, C) form)."""
        if name not in self.nchw:
            self.nodes.append(onnx.helper.make_node("Transpose", [self.nhwc[name]], [name], perm=TO_NCHW))
            self.nchw.add(name)

    def _fresh(self, name: str) -> str:
        candidate, suffix = name, 1
        while candidate in self.names:
            candidate, suffix = f"{name}_{suffix}", suffix + 1
        self.names.add(candidate)
        return candidate

    def _permuted_type(self, name: str, new_name: str, perm: list[int]) -> None:
        tensor_type = self.types.get(name)
        if tensor_type is None or self._rank(name) != 4:
            return
        permuted = onnx.TypeProto()
        permuted.CopyFrom(tensor_type)
        dims = list(tensor_type.tensor_type.shape.dim)
        del permuted.tensor_type.shape.dim[:]
        for axis in perm:
            permuted.tensor_type.shape.dim.add().CopyFrom(dims[axis])
        self.types[new_name] = permuted
        annotation = permuted
        if not all(dim.HasField("dim_value") or dim.HasField("dim_param") for dim in dims):
            # the element type only: ORT's compute optimizer, moving a Slice above this pass's Transpose back,
            # fails on a shape with an unknown dimension ("Invalid dim found in CreateNewShapeWithUpdatedDim")
            # and leaves a tensor without a shape as it is
            annotation = onnx.helper.make_tensor_type_proto(tensor_type.tensor_type.elem_type, None)
        self.graph.value_info.append(onnx.helper.make_value_info(new_name, annotation))


def _nhwc_form(node: onnx.NodeProto) -> tuple[str, tuple[int, ...]] | None:
    operator = aten_operator(node)
    if operator is None:
        return None
    overload = next((a.s.decode() for a in node.attribute if a.name == "overload_name"), "")
    if not operator.startswith("lightning_ort::") and overload:
        return None  # another overload of one of torch's operators
    return NHWC_FORMS.get(operator)


def _is_elementwise(node: onnx.NodeProto) -> bool:
    return _is_onnx(node, *ELEMENTWISE) or aten_operator(node) in ELEMENTWISE_OPERATORS


def _is_onnx(node: onnx.NodeProto, *op_types: str) -> bool:
    """Whether ``node`` is one of the standard ONNX ops ``op_types``."""
    return node.domain in ("", "ai.onnx") and node.op_type in op_types


def _set_operator(node: onnx.NodeProto, operator: str) -> None:
    """Make ``node`` run ``operator`` (whose gradient overloads, if any, are chosen later)."""
    attributes = [attribute for attribute in node.attribute if attribute.name != "overload_name"]
    for attribute in attributes:
        if attribute.name == "operator":
            attribute.s = operator.encode()
    del node.attribute[:]
    node.attribute.extend(attributes)


def register_gradients() -> None:
    """Give ORT's gradient builder the gradients of the channels-last forms (process-wide)."""
    register_convolution_gradients("_nhwc")
    register_batch_norm_gradient("_nhwc")
    pool = [f"I({i})" for i in range(6)]
    register_simple_gradient("lightning_ort::max_pool2d_nhwc", "lightning_ort::max_pool2d_nhwc_backward",
                             ["GO(0)", *pool, "O(1)"])  # fmt: skip
    register_simple_gradient("lightning_ort::avg_pool2d_nhwc", "lightning_ort::avg_pool2d_nhwc_backward",
                             ["GO(0)", *[f"I({i})" for i in range(7)]])  # fmt: skip
    register_simple_gradient("lightning_ort::adaptive_avg_pool2d_nhwc",
                             "lightning_ort::adaptive_avg_pool2d_nhwc_backward", ["GO(0)", "I(0)"])  # fmt: skip
    register_gradient("lightning_ort::group_norm_nhwc", "lightning_ort::group_norm_nhwc_backward",
                      ["GO(0)", "I(0)", "O(1)", "O(2)", "I(1)", "I(3)", "I(4)", "I(5)", "I(6)"],
                      ["GI(0)", "GI(1)", "GI(2)"])  # fmt: skip
    register_simple_gradient("lightning_ort::upsample_nearest2d_nhwc",
                             "lightning_ort::upsample_nearest2d_nhwc_backward", ["GO(0)", "I(0)", "I(2)"])  # fmt: skip
    register_simple_gradient("lightning_ort::upsample_bilinear2d_nhwc",
                             "lightning_ort::upsample_bilinear2d_nhwc_backward",
                             ["GO(0)", "I(0)", "I(2)", "I(3)"])  # fmt: skip
