"""Indexing ops torch exports wrongly for ORT, or in a form ORT cannot train.

- ``Tensor.scatter_add``: ORT's gradient of ``ScatterElements``'s data input is an overwrite's
  (zero at the scattered positions), also for ``reduction="add"``, so a ``self`` that needs a
  gradient lost it there: silently wrong training. Exported as ``self + scatter_add(zeros, ...)``.
- ``Tensor.index_add``: torch's export scatters the source (overwriting) where indices repeat, so
  only one of the repeated rows arrives: silently wrong training. It is exported as
  ``self + scatter_add(zeros, ...)`` (``ScatterElements`` with ``reduction="add"``, which ORT sums
  and differentiates correctly for the source, but not for the data input), with the index expanded
  to the source's shape and ``alpha`` applied to the source.
- ``index_put(..., accumulate=True)``: the same overwrite. One integer index tensor over dimension
  0 (``x.index_put((idx,), v, accumulate=True)``) is exported as that ``index_add``; other forms
  are refused at export, so the model falls back to PyTorch with the reason.
- ``scatter_reduce``: torch's export wraps the scatter in ``If`` nodes over the rank, and ORT's
  gradient builder aborts the process on them (SIGABRT). ``"sum"`` with ``include_self=True`` is
  exactly ``scatter_add``; the other reductions are refused at export.
- ``torch.flip``: exported as ``Slice`` with step -1, whose gradient (``SliceGrad``) fails in ORT
  over a dimension of static size. It runs torch's ``flip`` as an ATen node; its gradient is the
  gradient flipped over the same dimensions.
- ``torch.tile``: torch's export pads the repeats or the shape inside ``If`` nodes, and ORT's gradient
  builder aborts the process on them (SIGABRT), even at fixed shapes. With the number of repeats
  known at export it is ``Tensor.repeat`` (``Expand`` and ``Tile``), with the repeats padded with
  leading ones to the input's rank as ``tile`` does.
- ``torch.roll``: torch's export slices from ``-shift`` without taking the shift modulo the size, so
  a shift larger than the dimension (``roll(3, 0)`` on a batch of 2) left the tensor unrolled:
  silently wrong training; without ``dims`` the export failed. It runs torch's ``roll`` as an ATen
  node; its gradient is the gradient rolled back.
- ``repeat_interleave`` with a tensor of repeats: torch's export reshapes per repeat and ORT's
  gradient fails when one of them is 0. The input is gathered at the positions torch's
  ``repeat_interleave(repeats)`` gives (an ATen node); ``Gather``'s gradient sums the copies back.
- ``h[mask] = v`` with a boolean mask over fewer dimensions than ``h`` (wav2vec2's
  ``hidden_states[~attention_mask] = 0``): torch's export broadcasts the mask from the right
  (``masked_fill``) and the module fell back; it is ``Where`` with the mask given trailing dimensions.
- ``torch.diff`` and ``torch.take_along_dim``: torch 2.13 cannot export them, and models using them
  fell back to PyTorch. They run torch's kernels (``csrc/indexing.cc``, eager autograd as their
  gradients); ``diff``'s ``prepend`` and ``append`` are concatenated in the graph.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import (
    _type_utils,
    symbolic_helper,
    symbolic_opset9,
    symbolic_opset10,
    symbolic_opset11,
    symbolic_opset13,
    symbolic_opset16,
)

from lightning_ort.engine.ops.kernels.gradient_overloads import GRAD_DOMAIN, aten_node, register_simple_gradient
from lightning_ort.engine.ops.kernels.torch_kernels import ATEN, _none, aten_like, constant
from lightning_ort.engine.ops.symbolics.onnx_gradients import full_where

_INTEGERS = (_type_utils.JitScalarType.INT64, _type_utils.JitScalarType.INT)


def _scatter_add(g: Any, self: Any, dim: int, index: Any, src: Any) -> Any:
    """``self.scatter_add(dim, index, src)`` as ``self + scatter_add(zeros, ...)``: ORT's gradient of
    ``ScatterElements``'s data input zeroes the scattered positions (an overwrite's gradient), wrong
    for ``reduction="add"``; through the Add, ``self`` gets the whole gradient, as in eager."""
    scalar_type = _type_utils.JitScalarType.from_value(self, _type_utils.JitScalarType.FLOAT)
    zeros = g.op("ConstantOfShape", g.op("Shape", self), value_t=torch.tensor([0], dtype=scalar_type.dtype()))
    zeros.setType(self.type())
    return g.op("Add", self, symbolic_opset16.scatter_add(g, zeros, dim, index, src))


def _index_add(g: Any, self: Any, dim: Any, index: Any, source: Any, alpha: Any = None) -> Any:
    axis = symbolic_helper._maybe_get_const(dim, "i")
    rank = symbolic_helper._get_tensor_rank(self)
    if not isinstance(axis, int) or rank is None or symbolic_helper._get_tensor_rank(source) != rank:
        return symbolic_helper._unimplemented("index_add", "dim or ranks unknown, or source of another rank", self)
    axis = axis % max(rank, 1)
    if alpha is not None and not symbolic_helper._is_none(alpha):
        scale = symbolic_helper._maybe_get_const(alpha, "f")
        if symbolic_helper._is_value(scale):
            return symbolic_helper._unimplemented("index_add", "alpha not constant", self)
        if scale != 1:
            source_type = _type_utils.JitScalarType.from_value(source, _type_utils.JitScalarType.FLOAT)
            source = g.op("Mul", source, constant(g, scale, source_type.dtype()))
    # (n,) -> (1, ..., n, ..., 1) -> the source's shape: element [.., i, ..] of the source goes to index[i]
    position = [-1 if axis_ == axis else 1 for axis_ in range(rank)]
    index = g.op("Reshape", index, constant(g, position, torch.int64))
    index = g.op("Expand", index, g.op("Shape", source))
    index.setType(index.type().with_sizes([None] * rank))
    return _scatter_add(g, self, axis, index, source)


def _index_put(g: Any, self: Any, indices_list: Any, values: Any, accumulate: Any = False) -> Any:
    indices = symbolic_helper._unpack_list(indices_list) if symbolic_helper._is_packed_list(indices_list) else []
    if symbolic_helper._maybe_get_const(accumulate, "b") is False:
        masked = _masked_assignment(g, self, indices, values)
        return masked if masked is not None else symbolic_opset11.index_put(g, self, indices_list, values, accumulate)
    index = indices[0] if len(indices) == 1 else None
    if (
        index is None
        or symbolic_helper._is_none(index)
        or symbolic_helper._get_tensor_rank(index) != 1
        or _type_utils.JitScalarType.from_value(index, _type_utils.JitScalarType.UNDEFINED) not in _INTEGERS
        or symbolic_helper._get_tensor_rank(self) is None
    ):
        reason = "accumulate=True other than with one integer index tensor over dim 0 (would overwrite duplicates)"
        return symbolic_helper._unimplemented("index_put", reason, self)
    # the values broadcast to (n, *self.shape[1:]), as index_put broadcasts them
    rest = g.op(
        "Slice",
        g.op("Shape", self),
        constant(g, [1], torch.int64),
        constant(g, [torch.iinfo(torch.int64).max], torch.int64),
    )
    shape = g.op("Concat", g.op("Shape", index), rest, axis_i=0)
    values = g.op("Expand", values, shape)
    values.setType(self.type().with_sizes([None] * symbolic_helper._get_tensor_rank(self)))
    return _index_add(g, self, constant(g, 0, torch.int64), index, values)


def _masked_assignment(g: Any, self: Any, indices: list[Any], values: Any) -> Any:
    """``h[mask] = v`` with a boolean mask over h's leading dimensions and values that broadcast over the
    others (wav2vec2's ``hidden_states[~attention_mask] = 0``, ``x[mask] = self.mask_token``) as ``Where``
    with the mask given trailing dimensions; None for other forms."""
    if len(indices) != 1 or not symbolic_helper._is_bool(indices[0]):
        return None
    ranks = [symbolic_helper._get_tensor_rank(value) for value in (self, indices[0], values)]
    if None in ranks or not ranks[1] < ranks[0] or ranks[2] > ranks[0] - ranks[1]:
        return None
    mask = symbolic_helper._unsqueeze_helper(g, indices[0], list(range(ranks[1], ranks[0])))
    self_type = _type_utils.JitScalarType.from_value(self, _type_utils.JitScalarType.UNDEFINED)
    if self_type == _type_utils.JitScalarType.UNDEFINED:
        return None
    output = full_where(g, mask, g.op("Cast", values, to_i=self_type.onnx_type()), self)
    output.setType(self.type())
    return output


@symbolic_helper.parse_args("v", "i", "v", "v")
def _scatter_add_symbolic(g: Any, self: Any, dim: int, index: Any, src: Any) -> Any:
    return _scatter_add(g, self, dim, index, src)


@symbolic_helper.parse_args("v", "i", "v", "v", "s", "b")
def _scatter_reduce(g: Any, self: Any, dim: int, index: Any, src: Any, reduce: str, include_self: bool) -> Any:
    if reduce == "sum" and include_self:
        return _scatter_add(g, self, dim, index, src)
    reason = f'reduce="{reduce}" with include_self={include_self} (ORT cannot build its gradient)'
    return symbolic_helper._unimplemented("scatter_reduce", reason, self)


def _flip(g: Any, input: Any, dims: Any) -> Any:
    axes = symbolic_helper._maybe_get_const(dims, "is")
    if symbolic_helper._is_value(axes):
        return symbolic_opset10.flip(g, input, dims)
    return aten_like(g, "flip", input, constant(g, list(axes), torch.int64))


def _roll(g: Any, input: Any, shifts: Any, dims: Any) -> Any:
    amounts, axes = (symbolic_helper._maybe_get_const(value, "is") for value in (shifts, dims))
    if symbolic_helper._is_value(amounts) or symbolic_helper._is_value(axes):
        return symbolic_opset9.roll(g, input, shifts, dims)
    return aten_like(g, "roll", input, constant(g, list(amounts), torch.int64), constant(g, list(axes), torch.int64))


def _repeat_interleave(g: Any, self: Any, repeats: Any, dim: Any = None, output_size: Any = None) -> Any:
    axis = None if symbolic_helper._is_none(dim) else symbolic_helper._maybe_get_const(dim, "i")
    sizes = symbolic_helper._get_tensor_sizes(repeats) if symbolic_helper._is_value(repeats) else None
    rank = symbolic_helper._get_tensor_rank(self)
    if sizes is None or len(sizes) != 1 or sizes == [1] or symbolic_helper._is_value(axis) or rank is None:
        if axis is not None and not symbolic_helper._is_value(axis):
            # torch's symbolic adds the rank to a negative dim in place, on the tensor of the trace's one
            # shared constant -1: every other -1 of the graph (an Embedding's padding_idx) became 1
            dim = constant(g, axis % rank if rank is not None else axis, torch.int64)
        return symbolic_opset13.repeat_interleave(g, self, repeats, dim, output_size)
    if axis is None:  # over the flattened input
        self, axis, rank = g.op("Reshape", self, constant(g, [-1], torch.int64)), 0, 1
    # torch's own positions (0, 1, 1, 3, ... for repeats 1, 2, 0, 1, ...), gathered: GatherGrad sums them back
    positions = g.op(ATEN, repeats, _none(g), operator_s="repeat_interleave", overload_name_s="Tensor")
    positions.setType(repeats.type().with_sizes([None]))
    output = g.op("Gather", self, positions, axis_i=axis % rank)
    output.setType(self.type().with_sizes([None] * rank))
    return output


def _tile(g: Any, self: Any, dims: Any) -> Any:
    rank = symbolic_helper._get_tensor_rank(self)
    repeats = symbolic_helper._maybe_get_const(dims, "is")
    if rank is not None and not symbolic_helper._is_value(repeats):
        return symbolic_opset9.repeat(g, self, constant(g, [1] * (rank - len(repeats)) + list(repeats), torch.int64))
    if rank is not None and symbolic_helper._is_packed_list(dims):  # sizes read from tensors
        parts = [g.op("Reshape", part, constant(g, [1], torch.int64)) for part in symbolic_helper._unpack_list(dims)]
        ones = [constant(g, [1] * (rank - len(parts)), torch.int64)] if len(parts) < rank else []
        return symbolic_opset9.repeat(g, self, g.op("Concat", *ones, *parts, axis_i=0))
    raise torch.onnx.errors.SymbolicValueError(
        "Unsupported: ONNX export of torch.tile with repeats or an input of unknown length (ORT cannot train "
        "torch's form of it). Fix: use Tensor.repeat with one repeat per dimension",
        self,
    )


def _diff(g: Any, self: Any, n: Any, dim: Any, prepend: Any, append: Any) -> Any:
    order, axis = (symbolic_helper._maybe_get_const(value, "i") for value in (n, dim))
    rank = symbolic_helper._get_tensor_rank(self)
    if symbolic_helper._is_value(order) or symbolic_helper._is_value(axis) or rank is None:
        return symbolic_helper._unimplemented("diff", "n or dim not constant, or rank unknown", self)
    parts = [part for part in (prepend, self, append) if not symbolic_helper._is_none(part)]
    if len(parts) > 1:
        joined = g.op("Concat", *parts, axis_i=int(axis) % max(rank, 1))
        joined.setType(self.type().with_sizes([None] * rank))
        self = joined
    arguments = [constant(g, int(order), torch.int64), constant(g, int(axis), torch.int64)]
    return aten_like(g, "lightning_ort::diff", self, *arguments, same_sizes=False)


def _take_along_dim(g: Any, self: Any, indices: Any, dim: Any = None) -> Any:
    axis = None if dim is None or symbolic_helper._is_none(dim) else symbolic_helper._maybe_get_const(dim, "i")
    if axis is None or symbolic_helper._is_value(axis):
        return symbolic_helper._unimplemented("take_along_dim", "without a constant dim", self)
    output = aten_like(g, "lightning_ort::take_along_dim", self, indices, constant(g, int(axis), torch.int64))
    rank = symbolic_helper._get_tensor_rank(self)
    output.setType(self.type().with_sizes([None] * rank) if rank is not None else self.type())
    return output


def _flip_gradient() -> list[Any]:
    return [aten_node("flip", ["GO(0)", "I(1)"], ["GI(0)"])]


def _roll_gradient() -> list[Any]:
    return [("Neg", ["I(1)"], ["shifts_back"]), aten_node("roll", ["GO(0)", "shifts_back", "I(2)"], ["GI(0)"])]


def register() -> None:
    """Register the symbolics and gradients with ORT's registries (process-wide)."""
    from onnxruntime.training.ortmodule._custom_gradient_registry import CustomGradientRegistry
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("scatter_add", "", _scatter_add_symbolic)
    CustomOpSymbolicRegistry.register("index_add", "", _index_add)
    CustomOpSymbolicRegistry.register("index_put", "", _index_put)
    CustomOpSymbolicRegistry.register("scatter_reduce", "", _scatter_reduce)
    CustomOpSymbolicRegistry.register("flip", "", _flip)
    CustomOpSymbolicRegistry.register("repeat_interleave", "", _repeat_interleave)
    CustomOpSymbolicRegistry.register("tile", "", _tile)
    CustomOpSymbolicRegistry.register("roll", "", _roll)
    CustomOpSymbolicRegistry.register("diff", "", _diff)
    CustomOpSymbolicRegistry.register("take_along_dim", "", _take_along_dim)
    CustomGradientRegistry.register(GRAD_DOMAIN, "ATen", ("flip", ""), _flip_gradient)
    CustomGradientRegistry.register(GRAD_DOMAIN, "ATen", ("roll", ""), _roll_gradient)
    inputs = ["GO(0)", "I(0)", "I(1)", "I(2)"]
    register_simple_gradient("lightning_ort::diff", "lightning_ort::diff_backward", inputs)
    register_simple_gradient("lightning_ort::take_along_dim", "lightning_ort::take_along_dim_backward", inputs)
