"""Reductions ORT could not train, on torch's kernels inside ORT's graph.

torch exports vector norms (``torch.norm``, ``Tensor.norm``, ``torch.linalg.vector_norm``,
``torch.linalg.norm`` without ``ord``), ``torch.prod``, ``amax`` and ``amin`` as ONNX ``ReduceL1``/
``ReduceL2``/``ReduceProd``/``ReduceMax``/``ReduceMin``; ORT 1.19.2 has no gradient for most of them
and builds an invalid gradient graph for ``ReduceL2`` without ``keepdim`` or over all elements, so
models using them fell back to PyTorch. They are exported as ATen nodes running torch's operators,
with eager autograd's own gradients (``csrc/reductions.cc``): a norm's gradient is 0 where the
norm is, a product's is exact with zero factors, and amax/amin split it evenly among tied maxima,
whatever ``op_rewrites`` says. A norm with an explicit ``dtype`` keeps torch's export. torch 2.13
cannot export ``nansum`` and ``nanmean`` (a loss over targets with missing values); they run the same
way. ``count_nonzero``, which torch cannot export either, is a sum of booleans (no gradient).

Silently wrong before: ``x.std(dim)`` was exported as the square root of the variance, whose gradient
is NaN where the deviation is 0 (a constant row: the Annotated Transformer's hand-written LayerNorm
of a padding token's zero embedding); eager's is 0 there. It runs torch's ``std`` the same way.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import (
    _type_utils,
    symbolic_helper,
    symbolic_opset9,
    symbolic_opset11,
    symbolic_opset18,
)

from lightning_ort.engine.ops.kernels.gradient_overloads import register_simple_gradient
from lightning_ort.engine.ops.kernels.torch_kernels import ATEN, constant

_VECTOR_NORM = "lightning_ort::vector_norm"
_PROD = "lightning_ort::prod"
_STD = "lightning_ort::std"


def _dims(dim: Any) -> list[int] | None:
    """The constant dimensions ``dim`` names (empty for None: all of them), or None if not constant."""
    if dim is None or symbolic_helper._is_none(dim):
        return []
    try:
        dims = symbolic_helper._maybe_get_const(dim, "is")
    except TypeError:  # a single int (prod's dim)
        dims = [symbolic_helper._maybe_get_const(dim, "i")]
    if symbolic_helper._is_value(dims) or any(symbolic_helper._is_value(value) for value in dims):
        return None
    return [int(value) for value in dims]


def _reduced(g: Any, operator: str, input: Any, arguments: list[Any], dims: list[int], keep: bool) -> Any:
    """The ATen node running ``operator``, typed with the rank its reduction over ``dims`` leaves."""
    output = g.op(ATEN, input, *arguments, operator_s=operator)
    rank = symbolic_helper._get_tensor_rank(input)
    if rank is not None:
        reduced = rank if not dims or rank == 0 else len({dim % rank for dim in dims})
        output.setType(input.type().with_sizes([None] * (rank if keep else rank - reduced)))
    return output


def _vector_norm(g: Any, self: Any, ord: Any, dim: Any, keepdim: Any, dtype: Any) -> Any:
    order = symbolic_helper._maybe_get_const(ord, "f")
    dims = _dims(dim)
    keep = symbolic_helper._maybe_get_const(keepdim, "b")
    if (
        symbolic_helper._is_value(order)
        or dims is None
        or symbolic_helper._is_value(keep)
        or not symbolic_helper._is_none(dtype)
    ):
        fallback = symbolic_opset18 if g.opset >= 18 else symbolic_opset11
        return fallback.linalg_vector_norm(g, self, ord, dim, keepdim, dtype)
    return _norm_node(g, self, float(order), dims, bool(keep))


def _norm_node(g: Any, self: Any, order: float, dims: list[int], keep: bool) -> Any:
    arguments = [constant(g, order, torch.float64), constant(g, dims, torch.int64), constant(g, keep, torch.bool)]
    return _reduced(g, _VECTOR_NORM, self, arguments, dims, keep)


def _linalg_norm(g: Any, self: Any, ord: Any, dim: Any, keepdim: Any, dtype: Any) -> Any:
    """``torch.linalg.norm`` without ``ord``: the 2-norm over ``dim`` (a vector norm), as torch computes it."""
    dims = _dims(dim)
    keep = symbolic_helper._maybe_get_const(keepdim, "b")
    explicit = not symbolic_helper._is_none(ord) or not symbolic_helper._is_none(dtype)
    if explicit or dims is None or symbolic_helper._is_value(keep):
        return symbolic_opset9.linalg_norm(g, self, ord, dim, keepdim, dtype)
    return _norm_node(g, self, 2.0, dims, bool(keep))


def _prod(g: Any, self: Any, *arguments: Any) -> Any:
    """``torch.prod(x, dtype=None)`` or ``torch.prod(x, dim, keepdim, dtype=None)``."""
    dim, keepdim, dtype = arguments if len(arguments) == 3 else (None, False, arguments[0])
    dims = _dims(dim)
    keep = symbolic_helper._maybe_get_const(keepdim, "b")
    if dims is None or symbolic_helper._is_value(keep):
        symbolic_helper._onnx_unsupported("prod with a dimension that is not constant", self)
    if dtype is not None and not symbolic_helper._is_none(dtype):  # torch casts the input first
        onnx_type = _type_utils.JitScalarType(symbolic_helper._get_const(dtype, "i", "dtype")).onnx_type()
        self = g.op("Cast", self, to_i=onnx_type)
    arguments = [constant(g, dims, torch.int64), constant(g, bool(keep), torch.bool)]
    return _reduced(g, _PROD, self, arguments, dims, bool(keep))


def _over_dims(operator: str, node_operator: str) -> Any:
    """``operator(x, dim, keepdim)`` (and a ``dtype``, which none here takes) as the ATen node ``node_operator``."""

    def symbolic(g: Any, self: Any, dim: Any, keepdim: Any, dtype: Any = None) -> Any:
        dims = _dims(dim)
        keep = symbolic_helper._maybe_get_const(keepdim, "b")
        if dims is None or symbolic_helper._is_value(keep) or not (dtype is None or symbolic_helper._is_none(dtype)):
            symbolic_helper._onnx_unsupported(f"{operator} with dimensions that are not constant, or a dtype", self)
        arguments = [constant(g, dims, torch.int64), constant(g, bool(keep), torch.bool)]
        return _reduced(g, node_operator, self, arguments, dims, bool(keep))

    return symbolic


def _count_nonzero(g: Any, self: Any, dim: Any) -> Any:
    """``count_nonzero(x, dim=None)``: a sum of the input cast to booleans (NaN counts, as in torch)."""
    dims = _dims(dim)
    if dims is None:
        symbolic_helper._onnx_unsupported("count_nonzero with dimensions that are not constant", self)
    counted = g.op("Cast", g.op("Cast", self, to_i=_type_utils.JitScalarType.BOOL.onnx_type()),
                   to_i=_type_utils.JitScalarType.INT64.onnx_type())  # fmt: skip
    if dims:
        return g.op("ReduceSum", counted, constant(g, dims, torch.int64), keepdims_i=0)
    return g.op("ReduceSum", counted, keepdims_i=0)


def _standard_deviation(g: Any, input: Any, *args: Any) -> Any:
    """``std(x, unbiased)``, ``std(x, dim, unbiased, keepdim)`` or ``std(x, dim, correction=, keepdim=)``."""
    dim, correction, keepdim = (None, args[0], None) if len(args) == 1 else args
    dims = _dims(dim)
    keep = (
        False
        if keepdim is None or symbolic_helper._is_none(keepdim)
        else symbolic_helper._maybe_get_const(keepdim, "b")
    )
    fixed = 1.0 if correction is None or symbolic_helper._is_none(correction) else correction
    fixed = symbolic_helper._maybe_get_const(fixed, "f")  # unbiased (a bool) counts as 1 or 0
    if dims is None or symbolic_helper._is_value(keep) or symbolic_helper._is_value(fixed):
        return symbolic_opset9.std(g, input, *args)
    arguments = [constant(g, dims, torch.int64), constant(g, float(fixed), torch.float32), constant(g, bool(keep))]
    return _reduced(g, _STD, input, arguments, dims, bool(keep))


def register() -> None:
    """Register the symbolics and gradients with ORT's registries (process-wide)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("linalg_vector_norm", "", _vector_norm)
    CustomOpSymbolicRegistry.register("linalg_norm", "", _linalg_norm)
    CustomOpSymbolicRegistry.register("prod", "", _prod)
    for operator in ("amax", "amin"):
        CustomOpSymbolicRegistry.register(operator, "", _over_dims(operator, operator))
        register_simple_gradient(operator, f"lightning_ort::{operator}_backward", ["GO(0)", "I(0)", "I(1)", "I(2)"])
    CustomOpSymbolicRegistry.register("std", "", _standard_deviation)
    CustomOpSymbolicRegistry.register("count_nonzero", "", _count_nonzero)
    register_simple_gradient(_STD, f"{_STD}_backward", ["GO(0)", "I(0)", "I(1)", "I(2)", "I(3)"])
    for operator in ("nansum", "nanmean"):
        CustomOpSymbolicRegistry.register(operator, "", _over_dims(operator, f"lightning_ort::{operator}"))
        inputs = ["GO(0)", "I(0)", "I(1)", "I(2)"]
        register_simple_gradient(f"lightning_ort::{operator}", f"lightning_ort::{operator}_backward", inputs)
    inputs = ["GO(0)", "I(0)", "I(1)", "I(2)", "I(3)"]
    register_simple_gradient(_VECTOR_NORM, "lightning_ort::vector_norm_backward", inputs)
    register_simple_gradient(_PROD, "lightning_ort::prod_backward", ["GO(0)", "I(0)", "I(1)", "I(2)"])
