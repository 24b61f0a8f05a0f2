"""Random ops exported so that ORT draws from eager's distribution, in eager's dtype.

``torch.normal(mean, std, size, dtype=...)`` (and ``Tensor.normal_()``) exported in its dtype.

The tracer records ``torch.empty_like(h).normal_()`` as ``aten::normal(0.0, 1.0, h.shape, dtype=...)``,
and torch's symbolic ignores the dtype: the noise came out of ORT's graph in float64 (the type of
the float constants), which made the next layer fail or everything after it run in double. It is
exported as ONNX ``RandomNormalLike`` with the mean and standard deviation as attributes and the
requested dtype. Like dropout's masks inside ORT, the draws come from ORT's generator, not torch's.

``torch.bernoulli(probs)`` (no ``p``) is exported by torch as ONNX ``Bernoulli``, whose CPU kernel in
ORT 1.19.2 draws 1 with probability ``1 - probs``: a DropBlock mask kept 80% of the features where
eager kept 20%. It is exported as a uniform draw compared with the probabilities, as torch already
exports ``bernoulli(input, p)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import _type_utils, symbolic_helper, symbolic_opset9, symbolic_opset11


def _normal(g: Any, *args: Any) -> Any:
    if len(args) == 8:  # normal(float mean, float std, int[] size, *, generator, dtype, layout, device, pin_memory)
        mean, std, size, _, dtype = args[:5]
        values = [symbolic_helper._maybe_get_const(value, "f") for value in (mean, std)]
        if not any(symbolic_helper._is_value(value) for value in values):
            scalar_type = (
                _type_utils.JitScalarType.from_dtype(torch.get_default_dtype())
                if symbolic_helper._is_none(dtype)
                else _type_utils.JitScalarType(symbolic_helper._get_const(dtype, "i", "dtype"))
            )
            sizes = symbolic_helper._maybe_get_const(size, "is")
            if not symbolic_helper._is_value(sizes):
                size = g.op("Constant", value_t=torch.tensor(sizes, dtype=torch.int64))
            shaped = g.op("ConstantOfShape", size)
            return g.op(
                "RandomNormalLike",
                shaped,
                mean_f=float(values[0]),
                scale_f=float(values[1]),
                dtype_i=scalar_type.onnx_type(),
            )
    return symbolic_opset11.normal(g, *args)


def _bernoulli(g: Any, input: Any, p: Any = None, generator: Any = None, out: Any = None) -> Any:
    return symbolic_opset9.bernoulli(g, input, p, generator, out)


def register() -> None:
    """Register the symbolics with ORT's registry (process-wide)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("normal", "", _normal)
    CustomOpSymbolicRegistry.register("bernoulli", "", _bernoulli)
