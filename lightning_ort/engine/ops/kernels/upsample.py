"""Upsampling (``F.interpolate``, ``nn.Upsample``) that trains in ORT like eager PyTorch.

ORT 1.19.2 exports nearest and bicubic upsampling as ATen nodes that run torch's kernels, but:

- its gradients pass no scale factors, so the backward pass maps coordinates by the ratio of the
  sizes while the forward used the scale; with a scale that is not that ratio (``scale_factor=1.7``
  on 9 pixels gives 15), bicubic gradients came out wrong, silently;
- the exporter turns the scale factors into float32 constants, and with a scale float32 cannot
  hold (0.7, 1.3, 1/3) the output size (``floor(10 * 0.7)`` is 7, ``floor(10 * 0.7f)`` 6) and the
  pixels the nearest modes pick differ from eager's.

Linear, bilinear and trilinear upsampling (and nearest-exact) are exported as ONNX ``Resize``,
whose gradient has no CPU kernel in ORT, so models with them could not train in ORT at all.

Here every mode runs torch's own kernels, forward and backward, through lightning_ort's operators
(``csrc/upsample.cc``), with gradients that take the forward's scale factors as eager autograd
does. During ORT's export, ``F.interpolate`` with a scale factor (``nn.Upsample`` included) calls
those operators itself, with the scale factors as a float64 tensor, so the graph holds them exactly;
torch's upsampling functions called directly still get the exporter's float32 constants.
Independent of ``op_rewrites``: it is about correctness. With ``channels_last``, 2-D nearest and
bilinear upsampling run on the channels-last activations (channels_last.py).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.onnx._internal.torchscript_exporter import symbolic_helper

from lightning_ort.engine.ops.kernels.gradient_overloads import register_simple_gradient
from lightning_ort.engine.ops.kernels.torch_kernels import aten_like

# torch's operator -> lightning_ort's (which takes the input's rank as its dimensions)
_NEAREST = {
    "upsample_nearest1d": "lightning_ort::upsample_nearest",
    "upsample_nearest2d": "lightning_ort::upsample_nearest",
    "upsample_nearest3d": "lightning_ort::upsample_nearest",
    "_upsample_nearest_exact1d": "lightning_ort::upsample_nearest_exact",
    "_upsample_nearest_exact2d": "lightning_ort::upsample_nearest_exact",
    "_upsample_nearest_exact3d": "lightning_ort::upsample_nearest_exact",
}
_INTERPOLATING = {
    "upsample_linear1d": "lightning_ort::upsample_linear",
    "upsample_bilinear2d": "lightning_ort::upsample_linear",
    "upsample_trilinear3d": "lightning_ort::upsample_linear",
    "upsample_bicubic2d": "lightning_ort::upsample_bicubic",
}
# lightning_ort's upsampling operators: the batch and channels kept, new spatial sizes
OPERATORS = tuple(sorted({*_NEAREST.values(), *_INTERPOLATING.values()}))


def _scales(g: Any, scale_factors: Any) -> Any:
    """torch's scale factors (a float list, or absent when the call gives an output size) as a tensor."""
    if symbolic_helper._is_none(scale_factors):
        return scale_factors
    values = symbolic_helper._maybe_get_const(scale_factors, "fs")
    if symbolic_helper._is_value(values):
        return values
    return g.op("Constant", value_t=torch.tensor(values, dtype=torch.float64))


def _nearest_symbolic(operator: str) -> Callable[..., Any]:
    def symbolic(g: Any, input: Any, output_size: Any, scale_factors: Any) -> Any:
        return aten_like(g, operator, input, output_size, _scales(g, scale_factors), same_sizes=False)

    return symbolic


def _interpolating_symbolic(operator: str) -> Callable[..., Any]:
    def symbolic(g: Any, input: Any, output_size: Any, align_corners: Any, scale_factors: Any) -> Any:
        scales = _scales(g, scale_factors)
        return aten_like(g, operator, input, output_size, align_corners, scales, same_sizes=False)

    return symbolic


def _operator_symbolic(operator: str) -> Callable[..., Any]:
    """lightning_ort's operator called by :func:`exact_upsampling`'s ``F.interpolate``, as the ATen node."""

    def symbolic(g: Any, input: Any, *arguments: Any) -> Any:
        return aten_like(g, operator, input, *arguments, same_sizes=False)

    return symbolic


_MODES = {  # F.interpolate's mode -> lightning_ort's operator and the spatial dimensions it takes
    "nearest": ("upsample_nearest", (1, 2, 3)),
    "nearest-exact": ("upsample_nearest_exact", (1, 2, 3)),
    "linear": ("upsample_linear", (1,)),
    "bilinear": ("upsample_linear", (2,)),
    "trilinear": ("upsample_linear", (3,)),
    "bicubic": ("upsample_bicubic", (2,)),
}
_INTERPOLATE = F.interpolate


def _interpolate(
    input: torch.Tensor,
    size: Any = None,
    scale_factor: Any = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
    antialias: bool = False,
) -> torch.Tensor:
    """``F.interpolate``; with a scale factor, lightning_ort's operator with the factors in float64."""
    name, dims = _MODES.get(mode, ("", ()))
    spatial = input.dim() - 2
    nearest = name.startswith("upsample_nearest")
    if (
        scale_factor is None
        or size is not None
        or recompute_scale_factor
        or antialias
        or spatial not in dims
        or (nearest and align_corners is not None)
    ):
        return _INTERPOLATE(input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
    factors = list(scale_factor) if isinstance(scale_factor, (list, tuple)) else [scale_factor] * spatial
    if len(factors) != spatial:
        return _INTERPOLATE(input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
    with warnings.catch_warnings():  # a constant of the trace is what it is meant to be
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        scales = torch.tensor([float(factor) for factor in factors], dtype=torch.float64)
    operator = getattr(torch.ops.lightning_ort, name)
    if nearest:
        return operator(input, None, scales)
    return operator(input, None, bool(align_corners), scales)


@contextlib.contextmanager
def exact_upsampling() -> Iterator[None]:
    """Within the block (ORT's export), ``F.interpolate`` is :func:`_interpolate`."""
    F.interpolate = _interpolate
    try:
        yield
    finally:
        F.interpolate = _INTERPOLATE


def _register_gradient(operator: str, arguments: list[str]) -> None:
    """The gradient of ``operator``: its ``_backward`` on the output's gradient, the input's sizes
    and the forward's ``arguments``."""
    input_size = ("Shape", ["I(0)"], ["input_size"])
    register_simple_gradient(operator, f"{operator}_backward", ["GO(0)", "input_size", *arguments], (input_size,))


def register() -> None:
    """Register the symbolics and gradients with ORT's registries (process-wide; ORT's own symbolics
    for nearest and bicubic upsampling are replaced)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    for name, operator in _NEAREST.items():
        CustomOpSymbolicRegistry.register(name, "", _nearest_symbolic(operator))
    for name, operator in _INTERPOLATING.items():
        CustomOpSymbolicRegistry.register(name, "", _interpolating_symbolic(operator))
    for operator in OPERATORS:
        name = operator.removeprefix("lightning_ort::")
        CustomOpSymbolicRegistry.register(name, "lightning_ort", _operator_symbolic(operator))
    for operator in sorted(set(_NEAREST.values())):  # (input, output_size, scale_factors)
        _register_gradient(operator, ["I(2)"])
    for operator in sorted(set(_INTERPOLATING.values())):  # (input, output_size, align_corners, scale_factors)
        _register_gradient(operator, ["I(2)", "I(3)"])
