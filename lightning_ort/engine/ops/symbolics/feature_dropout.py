"""Channel-wise and alpha dropout in training mode (``nn.Dropout1d/2d/3d``, ``nn.AlphaDropout``,
``nn.FeatureAlphaDropout``).

torch refuses to export ``aten::feature_dropout``, ``aten::alpha_dropout`` and
``aten::feature_alpha_dropout`` in training mode, so a model with any of them fell back to PyTorch
as a whole. Each is exported as eager computes it (ATen's ``_dropout_impl``): a uniform draw
compared with ``1 - p`` gives the mask, of the input's shape or, channel-wise, of shape
``(N, C, 1, ...)``; dropout scales it by ``1 / (1 - p)``, alpha dropout by ``a`` and adds
``b = (mask - 1) * alpha * a + alpha * a * p``, with the same operations in the same order. The
gradient is ORT's gradient of the products. float16 and bfloat16 are refused (ATen rounds each
step's result; ORT's CPU kernels for them are missing anyway). As for every dropout in ORT's graph,
the masks come from ORT's random generator, not torch's.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import _type_utils, symbolic_helper

# SELU's negative saturation value, ATen's constant in ``_dropout_impl``.
_ALPHA = 1.7580993408473766
_EXACT_TYPES = (_type_utils.JitScalarType.FLOAT, _type_utils.JitScalarType.DOUBLE)


def _constant(g: Any, value: float, dtype: torch.dtype) -> Any:
    return g.op("Constant", value_t=torch.tensor(value, dtype=dtype))


def _noise_shape(g: Any, input: Any, rank: int) -> Any:
    """``(N, C, 1, ..., 1)`` for a rank-``rank`` input, as ATen's ``make_feature_noise``."""
    leading = symbolic_helper._slice_helper(g, g.op("Shape", input), axes=[0], starts=[0], ends=[2])
    if rank == 2:
        return leading
    ones = g.op("Constant", value_t=torch.ones(rank - 2, dtype=torch.int64))
    return g.op("Concat", leading, ones, axis_i=0)


def _symbolic(feature: bool, alpha: bool) -> Any:
    name = ("feature_" if feature else "") + ("alpha_" if alpha else "") + "dropout"

    @symbolic_helper.parse_args("v", "f", "b")
    def symbolic(g: Any, input: Any, p: float, train: bool) -> Any:
        if not train or p == 0:
            return input
        rank = symbolic_helper._get_tensor_rank(input)
        scalar_type = _type_utils.JitScalarType.from_value(input, _type_utils.JitScalarType.UNDEFINED)
        if (feature and (rank is None or rank < 2)) or scalar_type not in _EXACT_TYPES:
            return symbolic_helper._unimplemented(name, "in training, on an input other than float32/float64", input)
        dtype = scalar_type.dtype()
        if p == 1:
            return g.op("Mul", input, _constant(g, 0.0, dtype))
        shape = _noise_shape(g, input, rank) if feature else g.op("Shape", input)
        zeros = g.op("ConstantOfShape", shape, value_t=torch.zeros(1, dtype=dtype))
        kept = g.op("Less", g.op("RandomUniformLike", zeros), _constant(g, 1 - p, dtype))
        mask = g.op("Cast", kept, to_i=scalar_type.onnx_type())
        if not alpha:
            return g.op("Mul", input, g.op("Div", mask, _constant(g, 1 - p, dtype)))
        a = 1.0 / math.sqrt((_ALPHA * _ALPHA * p + 1) * (1 - p))
        shift = g.op("Mul", g.op("Add", mask, _constant(g, -1.0, dtype)), _constant(g, _ALPHA * a, dtype))
        shift = g.op("Add", shift, _constant(g, _ALPHA * a * p, dtype))
        scaled = g.op("Mul", input, g.op("Mul", mask, _constant(g, a, dtype)))
        return g.op("Add", scaled, shift)

    return symbolic


def register() -> None:
    """Register the symbolics with ORT's registry (process-wide), the in-place forms too."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    for feature in (False, True):
        for alpha in (False, True):
            if not feature and not alpha:
                continue  # plain dropout: ONNX ``Dropout``, which ORT trains
            name = ("feature_" if feature else "") + ("alpha_" if alpha else "") + "dropout"
            for suffix in ("", "_"):
                CustomOpSymbolicRegistry.register(name + suffix, "", _symbolic(feature, alpha))
