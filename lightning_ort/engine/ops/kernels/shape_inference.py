"""ORT's symbolic shape inference, without the dimensions it only assumed (no wrong broadcast gradients).

ORTModule annotates the exported graph with ORT's Python symbolic shape inference, run with
``auto_merge=True``: where two different symbolic dimensions meet in a broadcast (or an op needs them
equal), it takes them to be the same. ORT's gradient builder then reads the shapes of a broadcasting
node's operands: equal symbols mean "no broadcast, nothing to sum back", and even different symbols
are taken to match. When one of them is 1 at run time the gradient is not reduced: silently wrong
training. A squeeze-and-excitation gate does exactly this, ``x * sigmoid(conv(adaptive_avg_pool2d(x,
1)))`` (torchvision's MobileNetV3 and EfficientNet): the pool's output sizes are new symbols, merged
with the feature map's height and width.

Here every dimension the inference merged or broadcast against a different one is made unknown in
the graph's annotations. ORT's gradient builder then computes the broadcast at run time
(``BroadcastGradientArgs``), which is always right, and dimensions that no assumption touched keep
their static handling. Two kinds of merge assume nothing and keep their symbols: a symbol with
itself, and ``Min(k, s)`` with ``s`` (a fixed-size buffer sliced to a sequence length).

The inference is also given the output shapes of lightning_ort's ATen operators (of its upsampling
operators: the batch and channels kept), so that the symbols of the graph's inputs reach the
residual connections around them: ORT's gradient builder then passes such an Add's gradient on as
it is instead of summing it back at run time.

Over 300 lines because the output-shape rules of the registry's operators and the subclass of ORT's
inference that records its assumptions are read together by :func:`infer_shapes`; the rules alone are
about 150 lines.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import sympy
from onnx import helper
from onnxruntime.tools.symbolic_shape_infer import (
    SymbolicShapeInference,
    get_attribute,
    get_shape_from_sympy_shape,
    handle_negative_axis,
    is_literal,
)

from lightning_ort.engine.ops import registry
from lightning_ort.engine.ops.kernels import sampling, upsample
from lightning_ort.engine.ops.kernels.gradient_overloads import aten_operator

Shape = list[Any]  # ints and symbol names; None where unknown


def _same_as_input(shapes: list[Shape | None], flags: list[Any]) -> Shape | None:
    return shapes[0]


def _reduction(dims_at: int, keep_at: int) -> Callable[[list[Shape | None], list[Any]], Shape | None]:
    """The output of a reduction over the constant dimensions ``flags[dims_at]`` (none: all of them),
    kept as 1 where ``flags[keep_at]`` says so (the op registry's ``Reduction`` rows)."""

    def shape(shapes: list[Shape | None], flags: list[Any]) -> Shape | None:
        input, dims, keep = shapes[0], flags[dims_at], flags[keep_at]
        if input is None or dims is None or keep is None:
            return None
        dims = [int(dim) for dim in np.asarray(dims).reshape(-1)]  # the inference holds constants as arrays
        rank = len(input)
        reduced = {dim % rank for dim in dims} if dims and rank else set(range(rank))
        keep = bool(np.asarray(keep).reshape(-1)[0])
        return [1 if index in reduced else dim for index, dim in enumerate(input) if keep or index not in reduced]

    return shape


def _rank(info: onnx.ValueInfoProto) -> int | None:
    if not info.type.tensor_type.HasField("shape"):
        return None
    return len(info.type.tensor_type.shape.dim)


def _unknown(shapes: list[Shape | None], flags: list[Any]) -> Shape | None:
    return None


def _broadcast(shapes: list[Shape | None], flags: list[Any]) -> Shape | None:
    """Two inputs broadcast against each other (``lightning_ort::pow``, ``lightning_ort::atan2``)."""
    first, second = shapes[0], shapes[1]
    if first is None or second is None:
        return None
    rank = max(len(first), len(second))
    first, second = [1] * (rank - len(first)) + list(first), [1] * (rank - len(second)) + list(second)
    return [b if a == 1 else a if b == 1 or a == b else None for a, b in zip(first, second, strict=True)]


def _linear(shapes: list[Shape | None], flags: list[Any]) -> Shape | None:
    input, weight = shapes[0], shapes[1]  # weight: (out_features, in_features), or (in_features,)
    if input is None or weight is None or len(weight) not in (1, 2):
        return None
    return input[:-1] + weight[:-1]


def _attention(shapes: list[Shape | None], flags: list[Any]) -> Shape | None:
    query, key, value = shapes[:3]
    transposed = flags[6]  # (batch, length, heads, dim) rather than (batch, heads, length, dim)
    if query is None or key is None or value is None or transposed is None:
        return None
    if not len(query) == len(key) == len(value):
        return None
    length = len(query) - (3 if bool(transposed) else 2)
    batch = [index for index in range(len(query) - 1) if index != length]
    if any(not query[index] == key[index] == value[index] for index in batch):  # broadcast batches: unknown
        return None
    return query[:-1] + value[-1:]


def _matmul(shapes: list[Shape | None], flags: list[Any]) -> Shape | None:
    self, other = shapes[0], shapes[1]
    transpose_self, transpose_other = flags[2], flags[3]
    if self is None or other is None or transpose_self is None or transpose_other is None:
        return None
    if len(self) != len(other):  # batch dimensions that broadcast: left unknown
        return None
    rows = self[-1] if bool(transpose_self) else self[-2]
    columns = other[-2] if bool(transpose_other) else other[-1]
    batch = [dim if dim == other_dim else None for dim, other_dim in zip(self[:-2], other[:-2], strict=True)]
    return [*batch, rows, columns]


def einsum_shape(equation: str, operands: list[Shape | None]) -> Shape | None:
    """The output shape of ``torch.einsum(equation, ...)`` on operands of these shapes (None: an
    operand of unknown shape, whose labels' sizes are then unknown; not allowed with an ellipsis)."""
    inputs, arrow, output = equation.replace(" ", "").partition("->")
    sizes: dict[str, Any] = {}
    ellipsis: Shape = []
    for labels, shape in zip(inputs.split(","), operands, strict=True):
        before, dots, after = labels.partition("...")
        if shape is None:
            if dots:
                return None
            continue
        middle = len(shape) - len(before) - len(after)
        if middle < 0 or (not dots and middle):
            return None
        if dots and middle > len(ellipsis):
            ellipsis = shape[len(before) : len(before) + middle]
        for label, dim in zip(before + after, shape[: len(before)] + shape[len(shape) - len(after) :], strict=True):
            if sizes.get(label, 1) == 1:  # a label of size 1 broadcasts against the others
                sizes[label] = dim
    if not arrow:
        letters = [label for label in inputs if label.isalpha()]
        output = "..." + "".join(sorted(label for label in set(letters) if letters.count(label) == 1))
    before, dots, after = output.partition("...")
    return (
        [sizes.get(label) for label in before]
        + (list(ellipsis) if dots else [])
        + [sizes.get(label) for label in after]
    )


def _einsum(shapes: list[Shape | None], flags: list[Any]) -> Shape | None:
    """The output of ``lightning_ort::einsum``/``einsum2`` (equation as character codes, last input)."""
    codes = flags[-1]
    operands = shapes[:-1]
    if codes is None or any(shape is None for shape in operands):
        return None
    return einsum_shape("".join(chr(int(code)) for code in codes), operands)


def _rnn_layer(shapes: list[Shape | None], flags: list[Any]) -> Shape | None:
    sequence, state = shapes[0], shapes[1]  # (time, batch, features), (batch, hidden)
    if sequence is None or state is None or len(sequence) != 3 or len(state) != 2:
        return None
    return [sequence[0], sequence[1], state[1]]


# the op registry's rule names (registry.ShapeRule) -> the rules
_SHAPE_RULES: dict[str, Callable[[list[Shape | None], list[Any]], Shape | None]] = {
    "same": _same_as_input,
    "broadcast": _broadcast,
    "linear": _linear,
    "attention": _attention,
    "matmul": _matmul,
    "einsum": _einsum,
    "rnn_layer": _rnn_layer,
    "grid_sample": sampling.sampled_shape,
    "col2im": sampling.folded_shape,
    "affine_grid": sampling.grid_shape,
}


def _rule(shape: str | registry.Reduction) -> Callable[[list[Shape | None], list[Any]], Shape | None]:
    """The output-shape function of a registry row's rule."""
    if isinstance(shape, registry.Reduction):
        return _reduction(shape.dims_at, shape.keep_at)
    return _SHAPE_RULES[shape]


# Output 0 of the ATen operators of ORT's graphs (lightning_ort's and torch's own) from their inputs' shapes
# (and constant inputs, ``flags``), by the op registry's rows. Without them ORT's inference gives the
# outputs new symbols, which meet the graph's own in the next broadcast (a residual connection's Add) and
# are made unknown there (below); the gradient graph then sums such an Add's gradients at run time (a
# ReduceSum copy each) even where nothing broadcasts.
_OUTPUT_SHAPES: dict[str, Callable[[list[Shape | None], list[Any]], Shape | None]] = {
    operator: _rule(shape) for operator, shape in registry.shape_rules().items()
}


class _RecordingInference(SymbolicShapeInference):  # type: ignore[misc]
    """ORT's inference, recording the symbols it assumed equal to another dimension, and knowing the
    output shapes of lightning_ort's ATen operators."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.assumed: set[str] = set()
        self.exported_ranks: dict[str, int] = {}  # of ATen nodes' outputs, as torch's export typed them
        for operator, output_shape in _OUTPUT_SHAPES.items():
            self.aten_op_dispatcher_[operator] = functools.partial(self._infer_lightning_ort, output_shape)
        for operator in upsample.OPERATORS:  # batch and channels kept, new spatial sizes
            self.aten_op_dispatcher_.setdefault(operator, self._infer_aten_upsample)
        self.dispatcher_.setdefault("Mod", self._infer_Mod)

    def _infer_lightning_ort(
        self, output_shape: Callable[[list[Shape | None], list[Any]], Shape | None], node: onnx.NodeProto
    ) -> None:
        """Output 0's shape from ``output_shape``; new symbols for its dimensions not known and for
        the other outputs (as ORT's inference gives any operator it does not know)."""
        inputs = [self._try_get_shape(node, index) for index in range(len(node.input))]
        flags = [self._try_get_value(node, index) for index in range(len(node.input))]
        for index, name in enumerate(node.output):
            info = self.known_vi_.get(name) if name else None
            if info is None:
                continue
            tensor_type = info.type.tensor_type
            shape = output_shape(inputs, flags) if index == 0 else None
            if shape is None:  # the rank the exporter gave, else input 0's (ORT's guess for any operator)
                if name in self.exported_ranks:
                    shape = [None] * self.exported_ranks[name]
                elif tensor_type.HasField("shape"):
                    shape = [None] * len(tensor_type.shape.dim)
                elif inputs[0] is not None:
                    shape = [None] * len(inputs[0])
                else:
                    continue
            fresh = self._new_symbolic_shape(len(shape), node, index)
            # a new symbol may already be merged into a number
            fresh_dims = get_shape_from_sympy_shape(fresh)
            dims = [new if dim is None else dim for dim, new in zip(shape, fresh_dims, strict=True)]
            elem_type = tensor_type.elem_type or self.known_vi_[node.input[0]].type.tensor_type.elem_type
            info.CopyFrom(helper.make_tensor_value_info(name, elem_type, dims))

    def _infer_Split(self, node: onnx.NodeProto) -> None:  # noqa: N802 (ORT's naming)
        """ORT's inference casts split sizes to integers and raised on sizes it computed as expressions (a
        chunk or split of a dimension of unknown size: ``Max(1, Min(4, d - 4))``); the inference then gave up
        on the whole graph, and ORT failed to type the graph's ATen outputs (the module fell back). Such
        parts get new symbols for the split dimension."""
        try:
            super()._infer_Split(node)
        except TypeError:
            shape = self._get_sympy_shape(node, 0)
            axis = handle_negative_axis(get_attribute(node, "axis", 0), len(shape))
            elem_type = self.known_vi_[node.input[0]].type.tensor_type.elem_type
            for index, name in enumerate(node.output):
                dims = list(shape)
                dims[axis] = self._new_symbolic_dim_from_output(node, index, axis)
                info = helper.make_tensor_value_info(name, elem_type, get_shape_from_sympy_shape(dims))
                self.known_vi_[name].CopyFrom(info)

    def _infer_Mod(self, node: onnx.NodeProto) -> None:  # noqa: N802 (ORT's naming)
        """The value of a ``Mod`` of known integers (torch's ``unflatten`` export computes its
        dimension so, ``nn.Unflatten`` in a decoder): without it the reshape after it has a shape of
        unknown length, where ORT's inference fails."""
        if not any(attribute.name == "fmod" and attribute.i for attribute in node.attribute):
            self._compute_on_sympy_data(node, lambda values: values[0] % values[1])

    def _infer_aten_upsample(self, node: onnx.NodeProto) -> None:
        """ORT's, for an output size read from the input's shape too (``F.interpolate(h,
        size=x.shape[-2:])``, as segmentation heads do): ORT's put those sizes, sympy symbols, into
        the annotation as they were, which onnx rejects, and the whole inference failed."""
        input_shape = self._get_shape(node, 0)
        output_size = self._try_get_value(node, 1)
        if input_shape is None or output_size is None or not node.output[0]:
            super()._infer_aten_upsample(node)
            return
        shape = list(input_shape[:2]) + get_shape_from_sympy_shape(list(output_size))
        elem_type = self.known_vi_[node.input[0]].type.tensor_type.elem_type
        self.known_vi_[node.output[0]].CopyFrom(helper.make_tensor_value_info(node.output[0], elem_type, shape))

    def _add_suggested_merge(self, symbols: Any, apply: bool = False) -> Any:
        self.assumed.update(_assumed(symbols))
        return super()._add_suggested_merge(symbols, apply)

    def _apply_suggested_merge(self, graph_input_only: bool = False) -> None:
        """ORT's, except that in the annotations of values (not of the graph's inputs, whose merged
        symbols ORT's next pass requires gone) symbols only assumed equal to another dimension stay
        symbols, made unknown at the end. ORT wrote the number they were merged into over them
        (``gates[:, 1:2]`` of a one-hot's width, times an (N, 8) expert output, became (N, 8)), and
        the gradient builder then summed nothing back: the slice's gradient had 8 columns."""
        super()._apply_suggested_merge(graph_input_only=True)
        if graph_input_only:
            return
        kept = {symbol: self.suggested_merge_.pop(symbol) for symbol in self.assumed & set(self.suggested_merge_)}
        try:
            super()._apply_suggested_merge()
        finally:
            self.suggested_merge_.update(kept)

    def _broadcast_shapes(self, shape1: list[Any], shape2: list[Any]) -> list[Any]:
        for dim1, dim2 in zip(reversed(shape1), reversed(shape2), strict=False):  # ranks may differ
            if 1 not in (dim1, dim2):
                self.assumed.update(_assumed([dim1, dim2]))
        return super()._broadcast_shapes(shape1, shape2)


def _assumed(dims: list[Any]) -> set[str]:
    """The symbols among ``dims`` that taking ``dims`` to be equal assumes something about."""
    distinct = {str(dim) for dim in dims}
    if len(distinct) < 2 or (len(distinct) == 2 and _equal_where_valid(*distinct)):
        return set()
    return {str(dim) for dim in dims if not is_literal(dim)}


def _equal_where_valid(first: str, second: str) -> bool:
    """Whether two dimensions can only differ where broadcasting them fails anyway (an error, not a
    wrong gradient): ``Min(k, s)`` and ``s`` with k >= 2, a slice ``[:s]`` of a fixed size k (the
    positional embeddings or causal mask of a GPT cut to the sequence length). When s > k, neither is 1."""
    try:
        expressions = sympy.sympify(first), sympy.sympify(second)
    except (sympy.SympifyError, TypeError, SyntaxError):
        return False
    for minimum, other in (expressions, expressions[::-1]):
        if isinstance(minimum, sympy.Min) and len(minimum.args) == 2 and other in minimum.args:
            (bound,) = [arg for arg in minimum.args if arg != other]
            if bound.is_Integer and int(bound) >= 2:
                return True
    return False


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """What ORTModule's ``_infer_shapes`` returns, less the assumed dimensions (unknown instead).

    Raises what ORT's inference raises when it cannot complete, and when it would repeat itself forever."""
    inference = _RecordingInference(2**31 - 1, True, True, 0)  # int_max, auto_merge, guess_output_rank, verbose
    inference._preprocess(model)
    # ATen nodes: ORT's inference gave any operator it does not know its input 0's rank, wrong for a
    # reduction (``x.amax(-1).unsqueeze(-1)``: the gradient graph then reduced the wrong axes)
    exported = {info.name: _rank(info) for info in model.graph.value_info}
    for node in model.graph.node:
        operator = aten_operator(node)
        if operator is None:
            continue
        ranks = {name: exported[name] for name in node.output if exported.get(name) is not None}
        inference.exported_ranks.update(ranks)
        if operator not in inference.aten_op_dispatcher_:
            inference.aten_op_dispatcher_[operator] = functools.partial(inference._infer_lightning_ort, _unknown)
    complete = False
    merges: dict[Any, Any] | None = None
    while inference.run_:
        complete = inference._infer_impl()
        # another pass starts from the merges alone: with none new it would stop where this one did, forever
        # (a concatenation of dimensions only assumed equal, which _apply_suggested_merge keeps apart)
        if inference.run_ and inference.suggested_merge_ == merges:
            raise RuntimeError("ORT's symbolic shape inference stopped making progress")
        merges = dict(inference.suggested_merge_)
    inference._update_output_from_vi()
    if not complete:
        raise RuntimeError("ORT's symbolic shape inference could not complete")
    assumed = set(inference.assumed)
    for symbol in inference.assumed:
        merged_into = inference.suggested_merge_.get(symbol)
        if merged_into is not None and not is_literal(merged_into):
            assumed.add(str(merged_into))
    annotated = inference.out_mp_
    for info in annotated.graph.value_info:
        for dim in info.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in assumed:
                dim.Clear()
    return annotated
