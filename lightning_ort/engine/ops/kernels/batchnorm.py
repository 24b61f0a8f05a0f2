"""BatchNorm inside ORT graphs with PyTorch's running-statistics semantics.

ONNX's BatchNormalization (what the exporter emits) updates ``running_var`` with the biased batch
variance and cannot advance ``num_batches_tracked``; PyTorch uses the unbiased variance and counts
batches. ORT's training graph also turns eval-mode BatchNormalization nodes into training-mode ones.
We therefore export ``batch_norm`` with running statistics as an ATen node that ORT runs with
torch's own ``native_batch_norm`` kernel, which updates the running statistics in place exactly as
eager PyTorch does, and give ORT the matching ``native_batch_norm_backward`` gradient (through
``lightning_ort::batch_norm`` wrappers whose overloads handle frozen inputs, weights and biases, see
gradient_overloads.py).
``num_batches_tracked`` is advanced by lightning_ort after each ORT training step (see
:func:`advance_batch_counters`).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import symbolic_helper, symbolic_opset14

from lightning_ort.engine.ops.kernels.gradient_overloads import register_gradient
from lightning_ort.engine.ops.kernels.layers import batch_statistics_norm, filled_like
from lightning_ort.engine.ops.kernels.torch_kernels import ATEN

_BATCH_NORM = "lightning_ort::batch_norm"


def batch_norm_symbolic(
    g: Any,
    input: Any,
    weight: Any,
    bias: Any,
    running_mean: Any,
    running_var: Any,
    training: Any,
    momentum: Any,
    eps: Any,
    cudnn_enabled: Any,
) -> Any:
    # Eval-mode layers go through ATen too: ORT's training graph rewrites every ONNX
    # BatchNormalization into its training-mode kernel, which would ignore the running statistics.
    if running_mean is None or symbolic_helper._is_none(running_mean):
        output = batch_statistics_norm(g, input, weight, bias, eps)
        if output is not None:
            return output
        return symbolic_opset14.batch_norm(
            g, input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled
        )
    # affine=False: torch's helper makes ones and zeros of the input's channel count, which the export
    # does not always know (after a product with a 0-d tensor, a roll); the statistics' size it does
    if symbolic_helper._is_none(weight):
        weight = filled_like(g, running_mean, 1.0)
    if symbolic_helper._is_none(bias):
        bias = filled_like(g, running_mean, 0.0)
    weight, bias, running_mean, running_var = symbolic_helper._batchnorm_helper(
        g, input, weight, bias, running_mean, running_var
    )
    return g.op(
        ATEN,
        input,
        weight,
        bias,
        running_mean,
        running_var,
        training,
        g.op("Cast", momentum, to_i=1),
        g.op("Cast", eps, to_i=1),
        operator_s=_BATCH_NORM,
        outputs=3,
    )[0]


def register() -> None:
    """Register the symbolic and its gradients with ORT's registries (applied at each ORTModule creation)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("batch_norm", "", batch_norm_symbolic)
    register_batch_norm_gradient()


def register_batch_norm_gradient(layout: str = "") -> None:
    """The gradient of ``lightning_ort::batch_norm<layout>`` (``"_nhwc"``: the channels-last form of
    channels_last.py)."""
    inputs = ["GO(0)", "I(0)", "I(1)", "I(3)", "I(4)", "O(1)", "O(2)", "I(5)", "I(7)"]
    register_gradient(f"{_BATCH_NORM}{layout}", f"{_BATCH_NORM}{layout}_backward", inputs, ["GI(0)", "GI(1)", "GI(2)"])


def batch_counters(module: torch.nn.Module) -> list[torch.nn.modules.batchnorm._BatchNorm]:
    """BatchNorm layers of ``module`` whose ``num_batches_tracked`` an ORT graph cannot advance."""
    return [
        layer
        for layer in module.modules()
        if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm) and layer.num_batches_tracked is not None
    ]


# How many times one forward call runs each layer (0 when unused, 2 when applied twice), as the
# export's trace counted it; 1 for a layer no export has counted yet.
_CALLS_PER_FORWARD: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()


def record_calls_per_forward(layer: torch.nn.Module, calls: int) -> None:
    """``layer`` ran ``calls`` times in a training-mode forward traced by ORT's export."""
    _CALLS_PER_FORWARD[layer] = calls


def advance_batch_counters(layers: list[torch.nn.modules.batchnorm._BatchNorm]) -> None:
    """Do what ``_BatchNorm.forward`` does in Python for each training-mode layer ORT just ran."""
    with torch.no_grad():
        for layer in layers:
            calls = _CALLS_PER_FORWARD.get(layer, 1)
            if layer.training and layer.track_running_stats and calls:
                layer.num_batches_tracked.add_(calls)


def recorded_calls(module: torch.nn.Module) -> dict[str, int]:
    """How often one forward of ``module`` runs each of its BatchNorm layers, by name, as counted."""
    return {name: _CALLS_PER_FORWARD[layer] for name, layer in module.named_modules() if layer in _CALLS_PER_FORWARD}


def restore_calls(module: torch.nn.Module, calls: dict[str, int]) -> None:
    """Take over counts saved by :func:`recorded_calls` for the layers of ``module``."""
    for name, layer in module.named_modules():
        if name in calls:
            record_calls_per_forward(layer, int(calls[name]))
