"""``F.l1_loss``, ``F.smooth_l1_loss`` and ``F.huber_loss`` inside a forward, which torch cannot export.

Box regression losses computed in ``forward`` (FCOS-style detection heads) made the module fall back
to PyTorch ("Exporting the operator 'aten::l1_loss' ... is not supported"). They are exported as eager
computes them, element by element (``|d|``; ``0.5 * |d| * |d| / beta`` below ``beta``, ``|d| - 0.5 *
beta`` above; Huber's ``0.5 * |d| * |d|`` and ``delta * (|d| - 0.5 * delta)``, with ``d = input -
target``), then reduced as ``F.mse_loss``'s export is; ORT's gradients of these ops are eager's formulas.
"""

from __future__ import annotations

from typing import Any

from torch.onnx._internal.torchscript_exporter import _type_utils, symbolic_helper

from lightning_ort.engine.ops.kernels.torch_kernels import constant


def _reduced(g: Any, loss: Any, reduction: int, input: Any) -> Any:
    if reduction == 0:
        return loss
    if reduction == 1:
        return g.op("ReduceMean", loss, keepdims_i=0)
    if reduction == 2:
        return symbolic_helper._reducesum_helper(g, loss, keepdims_i=0)
    return symbolic_helper._onnx_unsupported("a loss with a reduction other than none, mean or sum", input)


def _number(g: Any, value: float, like: Any) -> Any:
    """``value`` as a constant of ``like``'s type (float32 where the export does not know it)."""
    scalar = _type_utils.JitScalarType.from_value(like, _type_utils.JitScalarType.FLOAT)
    return constant(g, value, scalar.dtype())


@symbolic_helper.parse_args("v", "v", "i")
def _l1_loss(g: Any, input: Any, target: Any, reduction: int) -> Any:
    return _reduced(g, g.op("Abs", g.op("Sub", input, target)), reduction, input)


def _piecewise(g: Any, input: Any, target: Any, bound: float, huber: bool) -> Any:
    """Smooth L1 (``huber=False``) or Huber loss per element, with ``bound`` its beta or delta."""
    distance = g.op("Abs", g.op("Sub", input, target))
    if bound == 0:
        return distance
    half = _number(g, 0.5, distance)
    square = g.op("Mul", g.op("Mul", half, distance), distance)
    linear = g.op("Sub", distance, _number(g, 0.5 * bound, distance))
    if huber:
        linear = g.op("Mul", _number(g, bound, distance), linear)
    else:
        square = g.op("Div", square, _number(g, bound, distance))
    return g.op("Where", g.op("Less", distance, _number(g, bound, distance)), square, linear)


@symbolic_helper.parse_args("v", "v", "i", "f")
def _smooth_l1_loss(g: Any, input: Any, target: Any, reduction: int, beta: float) -> Any:
    return _reduced(g, _piecewise(g, input, target, beta, huber=False), reduction, input)


@symbolic_helper.parse_args("v", "v", "i", "f")
def _huber_loss(g: Any, input: Any, target: Any, reduction: int, delta: float) -> Any:
    return _reduced(g, _piecewise(g, input, target, delta, huber=True), reduction, input)


def register() -> None:
    """Register the symbolics with ORT's registry (process-wide)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("l1_loss", "", _l1_loss)
    CustomOpSymbolicRegistry.register("smooth_l1_loss", "", _smooth_l1_loss)
    CustomOpSymbolicRegistry.register("huber_loss", "", _huber_loss)
