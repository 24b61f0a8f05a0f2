"""Distances torch exports as formulas ORT computes wrongly, on torch's kernels inside ORT's graph.

torch exports ``torch.cdist`` with ``p != 2`` (and small inputs with ``p == 2``) and
``F.pairwise_distance`` as ``pow(sum(pow(x1 - x2, p)), 1/p)`` without the absolute value: NaN for
odd or fractional ``p`` from the first step, a constant for ``p=inf``. ``cdist`` with ``p == 2``
(the matrix product form) has a NaN gradient at an exact zero distance, where eager's is 0, and
``F.cosine_similarity`` (``sqrt`` of the product of squared norms, clamped) a NaN gradient where a
vector is all zeros (masked padding), where eager's is finite. All trained silently wrong. They
are exported as ATen nodes running torch's operators, with eager autograd's gradients (``csrc/distances.cc``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import symbolic_helper, symbolic_opset9

from lightning_ort.engine.ops.kernels.gradient_overloads import register_gradient
from lightning_ort.engine.ops.kernels.torch_kernels import ATEN, constant

_CDIST = "lightning_ort::cdist"
_PAIRWISE = "lightning_ort::pairwise_distance"
_COSINE = "lightning_ort::cosine_similarity"


def _cdist(g: Any, x1: Any, x2: Any, p: Any = 2.0, compute_mode: Any = None) -> Any:
    norm = symbolic_helper._maybe_get_const(p, "f")
    mode = -1 if compute_mode is None or symbolic_helper._is_none(compute_mode) else compute_mode
    mode = symbolic_helper._maybe_get_const(mode, "i")
    rank = symbolic_helper._get_tensor_rank(x1)
    if symbolic_helper._is_value(norm) or symbolic_helper._is_value(mode) or rank is None:
        return symbolic_opset9.cdist(g, x1, x2, p, compute_mode)
    arguments = (constant(g, float(norm), torch.float32), constant(g, int(mode), torch.int64))
    output = g.op(ATEN, x1, x2, *arguments, operator_s=_CDIST)
    output.setType(x1.type().with_sizes([None] * rank))
    return output


def _known(arguments: tuple[tuple[Any, str], ...], tensors: tuple[Any, ...]) -> tuple[list[Any], list[int]] | None:
    """The constant ``(value, kind)`` arguments and the tensors' ranks, or None if any is unknown at export."""
    constants = [symbolic_helper._maybe_get_const(value, kind) for value, kind in arguments]
    ranks = [symbolic_helper._get_tensor_rank(value) for value in tensors]
    if any(symbolic_helper._is_value(value) for value in constants) or None in ranks:
        return None
    return constants, ranks


def _pairwise_distance(g: Any, x1: Any, x2: Any, p: Any, eps: Any, keepdim: Any) -> Any:
    known = _known(((p, "f"), (eps, "f"), (keepdim, "b")), (x1, x2))
    if known is None:
        return symbolic_opset9.pairwise_distance(g, x1, x2, p, eps, keepdim)
    (norm, epsilon, keep), ranks = known
    floats = (
        constant(g, float(norm), torch.float32),
        constant(g, float(epsilon), torch.float32),
        constant(g, bool(keep), torch.bool),
    )
    output = g.op(ATEN, x1, x2, *floats, operator_s=_PAIRWISE)
    rank = max(ranks)  # broadcast inputs; the last dimension reduced unless kept
    output.setType(x1.type().with_sizes([None] * (rank if keep or rank <= 1 else rank - 1)))
    return output


def _cosine_similarity(g: Any, x1: Any, x2: Any, dim: Any, eps: Any) -> Any:
    known = _known(((dim, "i"), (eps, "f")), (x1, x2))
    if known is None:
        return symbolic_opset9.cosine_similarity(g, x1, x2, dim, eps)
    (reduced, epsilon), ranks = known
    arguments = (constant(g, int(reduced), torch.int64), constant(g, float(epsilon), torch.float32))
    output = g.op(ATEN, x1, x2, *arguments, operator_s=_COSINE)
    output.setType(x1.type().with_sizes([None] * (max(ranks) - 1)))  # broadcast inputs, `dim` reduced
    return output


def register() -> None:
    """Register the symbolics and gradients with ORT's registries (process-wide)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("cdist", "", _cdist)
    CustomOpSymbolicRegistry.register("pairwise_distance", "", _pairwise_distance)
    CustomOpSymbolicRegistry.register("cosine_similarity", "", _cosine_similarity)
    register_gradient(_CDIST, f"{_CDIST}_backward", ["GO(0)", "I(0)", "I(1)", "I(2)", "I(3)"], ["GI(0)", "GI(1)"])
    register_gradient(_PAIRWISE, f"{_PAIRWISE}_backward", ["GO(0)", "I(0)", "I(1)", "I(2)", "I(3)", "I(4)"],
                      ["GI(0)", "GI(1)"])  # fmt: skip
    register_gradient(_COSINE, f"{_COSINE}_backward", ["GO(0)", "I(0)", "I(1)", "I(2)", "I(3)"], ["GI(0)", "GI(1)"])
