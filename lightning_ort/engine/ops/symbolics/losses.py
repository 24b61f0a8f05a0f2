"""Cross-entropy losses ORT 1.19.2 could not train, made trainable.

torch's exporter fuses ``F.nll_loss(F.log_softmax(logits, 1), target)`` on 2-D logits (the classic
MNIST model) into an ONNX ``SoftmaxCrossEntropyLoss`` with only the loss as output, while ORT's
gradient for it reads the second output, the log-probabilities: building the gradient graph failed
with "i < node_->OutputDefs().size() was false" and the model fell back to PyTorch. The graph
rewrite :func:`add_log_prob_outputs` gives such nodes their second output before ORT builds the
gradient.

``F.cross_entropy`` with class probabilities as targets was exported by ORT's symbolic as
``SoftmaxCrossEntropyLossInternal``, which only takes class indices (an invalid graph). Floating
targets are exported as eager computes them instead: ``-(target * log_softmax(logits, 1))`` summed
over classes (weighted per class, with label smoothing), then averaged over the batch or summed.
Class-index targets with ``label_smoothing``, which ORT's symbolic refused, add torch's smoothing
term to ORT's loss.
"""

from __future__ import annotations

from typing import Any

import onnx
import torch
from torch.onnx._internal.torchscript_exporter import _type_utils, symbolic_helper

from lightning_ort.engine.ops.kernels.torch_kernels import constant

_FUSED_LOSS = "SoftmaxCrossEntropyLoss"
_REDUCTIONS = ("none", "mean", "sum")


def add_log_prob_outputs(model: onnx.ModelProto) -> None:
    """Give every ONNX ``SoftmaxCrossEntropyLoss`` its log-probability output, which ORT's gradient reads."""
    for node in model.graph.node:
        if node.op_type == _FUSED_LOSS and node.domain in ("", "ai.onnx") and len(node.output) == 1:
            node.output.append(f"{node.output[0]}_log_prob")


def _cross_entropy_loss(
    g: Any,
    logits: Any,
    target: Any,
    weight: Any,
    reduction: Any,
    ignore_index: Any,
    label_smoothing: Any = None,
) -> Any:
    if symbolic_helper._is_fp(target):
        return _probability_targets(g, logits, target, weight, reduction, label_smoothing)
    smoothing = 0.0 if label_smoothing is None else symbolic_helper._maybe_get_const(label_smoothing, "f")
    if symbolic_helper._is_value(smoothing) or not smoothing:
        return _ort_cross_entropy_loss(g, logits, target, weight, reduction, ignore_index, label_smoothing)
    return _smoothed_indices(g, logits, target, weight, reduction, ignore_index, float(smoothing))


def _ort_cross_entropy_loss(g: Any, *args: Any) -> Any:
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import cross_entropy_loss

    return cross_entropy_loss(g, *args)


def _probability_targets(g: Any, logits: Any, target: Any, weight: Any, reduction: Any, smoothing: Any) -> Any:
    rank = symbolic_helper._get_tensor_rank(logits)
    mode = _REDUCTIONS[symbolic_helper._maybe_get_const(reduction, "i")]
    smoothing = 0.0 if smoothing is None else float(symbolic_helper._maybe_get_const(smoothing, "f"))
    if rank is None or symbolic_helper._is_value(smoothing):
        raise RuntimeError("cross_entropy with probability targets needs logits of known rank to export to ONNX")
    class_axis = 1 if rank > 1 else 0
    log_prob = g.op("LogSoftmax", logits, axis_i=class_axis)
    if smoothing > 0:
        classes = g.op("CastLike", _classes(g, logits, class_axis), target)
        keep = g.op("CastLike", constant(g, 1.0 - smoothing, torch.float32), target)
        target = g.op(
            "Add",
            g.op("Mul", target, keep),
            g.op("Div", g.op("CastLike", constant(g, smoothing, torch.float32), target), classes),
        )
    product = _weighted(g, g.op("Mul", log_prob, target), weight, rank)
    loss = g.op("Neg", g.op("ReduceSum", product, constant(g, [class_axis], torch.int64), keepdims_i=0))
    if mode == "mean":
        return g.op("ReduceMean", loss, keepdims_i=0) if rank > 1 else loss
    if mode == "sum":
        return g.op("ReduceSum", loss, keepdims_i=0) if rank > 1 else loss
    return loss


def _smoothed_indices(
    g: Any, logits: Any, target: Any, weight: Any, reduction: Any, ignore_index: Any, smoothing: float
) -> Any:
    """Label smoothing with class-index targets, as torch computes it: ``(1 - s)`` times the loss
    without smoothing (ORT's fused loss) plus ``s / classes`` times the reduced
    ``-sum_c(weight_c * log_softmax_c)``, zero at ignored targets."""
    rank = symbolic_helper._get_tensor_rank(logits)
    ignored = symbolic_helper._maybe_get_const(ignore_index, "i")
    mode = symbolic_helper._maybe_get_const(reduction, "i")
    if rank is None or symbolic_helper._is_value(ignored) or symbolic_helper._is_value(mode):
        raise RuntimeError("cross_entropy with label_smoothing needs logits of known rank and constant arguments")
    loss = _ort_cross_entropy_loss(g, logits, target, weight, reduction, ignore_index, 0.0)
    # constants in the logits' type (CastLike from a tensor that needs a gradient has no ORT gradient)
    scalar_type = _type_utils.JitScalarType.from_value(logits, _type_utils.JitScalarType.FLOAT)

    class_axis = 1 if rank > 1 else 0
    log_prob = _weighted(g, g.op("LogSoftmax", logits, axis_i=class_axis), weight, rank)
    smooth = g.op("Neg", g.op("ReduceSum", log_prob, constant(g, [class_axis], torch.int64), keepdims_i=0))
    is_ignored = g.op("Equal", target, g.op("CastLike", constant(g, ignored, torch.int64), target))
    smooth = g.op("Where", is_ignored, constant(g, 0.0, scalar_type.dtype()), smooth)
    if _REDUCTIONS[mode] == "sum":
        smooth = g.op("ReduceSum", smooth, keepdims_i=0)
    elif _REDUCTIONS[mode] == "mean":
        kept = g.op("Cast", g.op("Not", is_ignored), to_i=scalar_type.onnx_type())
        if not symbolic_helper._is_none(weight):  # normalized by the targets' weights, as nll_loss
            safe = g.op("Where", is_ignored, g.op("CastLike", constant(g, 0, torch.int64), target), target)
            kept = g.op("Mul", kept, g.op("Gather", weight, safe, axis_i=0))
        smooth = g.op("Div", g.op("ReduceSum", smooth, keepdims_i=0), g.op("ReduceSum", kept, keepdims_i=0))
    classes = g.op("Cast", _classes(g, logits, class_axis), to_i=scalar_type.onnx_type())
    share = g.op("Div", constant(g, smoothing, scalar_type.dtype()), classes)
    kept_loss = g.op("Mul", constant(g, 1.0 - smoothing, scalar_type.dtype()), loss)
    return g.op("Add", kept_loss, g.op("Mul", share, smooth))  # no CastLike: ORT has no gradient for it


def _weighted(g: Any, values: Any, weight: Any, rank: int) -> Any:
    """``values`` (classes on axis 1, or 0 for 1-D logits) times the class weights, if any."""
    if symbolic_helper._is_none(weight):
        return values
    shape = [-1] + [1] * (rank - 2) if rank > 1 else [-1]
    return g.op("Mul", values, g.op("Reshape", weight, constant(g, shape, torch.int64)))


def _classes(g: Any, logits: Any, class_axis: int) -> Any:
    """The number of classes (a 1-element int64 tensor)."""
    return g.op("Gather", g.op("Shape", logits), constant(g, class_axis, torch.int64), axis_i=0)


def register() -> None:
    """Register the symbolic with ORT's registry (process-wide)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("cross_entropy_loss", "", _cross_entropy_loss)
