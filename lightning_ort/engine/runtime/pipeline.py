"""What happens to a module's graph between torch's trace and ORT's gradient graph, in order, written once.

Two lists, each run by one hook (``export_hooks.py``, ``graph_hooks.py``):

- :data:`EXPORT_CONTEXTS`: what ORT's export of a module runs inside, entered in this order (inside the
  export cache, which decides whether torch traces at all).
- :data:`GRAPH_STEPS`: the checks and passes over the exported graph each time ORT (re)builds its
  gradient graph. The checks come first and see the graph as exported; the gradient-overload choice
  follows every pass that adds lightning_ort's ATen nodes (channels-last, unbind), and the dimension names
  come last.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import onnx
import torch

from lightning_ort.engine.export.batchnorm_order import check_batch_norm_order
from lightning_ort.engine.export.export_guard import guarded_export
from lightning_ort.engine.export.recurrent_weights import check_recurrent_weights
from lightning_ort.engine.export.sequences import check_sequences
from lightning_ort.engine.ops.kernels.gradient_overloads import choose_overloads
from lightning_ort.engine.ops.kernels.op_rewrites import rewritten_symbolics
from lightning_ort.engine.ops.kernels.upsample import exact_upsampling
from lightning_ort.engine.ops.symbolics.losses import add_log_prob_outputs
from lightning_ort.engine.ops.symbolics.mha_export import dynamic_attention_shapes
from lightning_ort.engine.passes.attention_fusion import fuse_attention
from lightning_ort.engine.passes.bidirectional_rnn import split_bidirectional_rnns
from lightning_ort.engine.passes.channels_last import to_channels_last
from lightning_ort.engine.passes.concat_fills import pad_constant_fills
from lightning_ort.engine.passes.constant_outputs import keep_constant_outputs_computed
from lightning_ort.engine.passes.dim_names import sanitize_dim_names
from lightning_ort.engine.passes.unbind import fuse_unbinds
from lightning_ort.engine.runtime.settings import ModuleSettings


@dataclass(frozen=True)
class ExportContext:
    """A context ORT's export of a module runs inside."""

    name: str
    enter: Callable[[torch.nn.Module, ModuleSettings, int], contextlib.AbstractContextManager[Any]]


EXPORT_CONTEXTS: tuple[ExportContext, ...] = (
    # refuses (ORTUnsupportedModelError) a module whose trace would not train as in PyTorch
    ExportContext("export guard", lambda module, settings, opset: guarded_export(module)),
    # nn.MultiheadAttention's reshapes to the sizes of the call, not the trace's numbers
    ExportContext("dynamic attention shapes", lambda module, settings, opset: dynamic_attention_shapes()),
    # interpolate's exact forms (nearest-exact, align_corners) as ATen nodes
    ExportContext("exact upsampling", lambda module, settings, opset: exact_upsampling()),
    # ops ORT's CPU kernels run slowly exported as ATen nodes on torch's kernels (op_rewrites)
    ExportContext("op rewrites", lambda module, settings, opset: rewritten_symbolics(settings.op_rewrites, opset)),
)


@dataclass(frozen=True)
class GraphStep:
    """A check (raises :class:`~lightning_ort.errors.ORTUnsupportedModelError`) or a pass (rewrites the
    graph in place) over the exported graph, given the graph inputs that need gradients."""

    name: str
    run: Callable[[onnx.ModelProto, list[str]], object]
    applies: Callable[[ModuleSettings], bool] = lambda settings: True


def _graph_only(step: Callable[[onnx.ModelProto], object]) -> Callable[[onnx.ModelProto, list[str]], object]:
    return lambda model, requiring_grad: step(model)


GRAPH_STEPS: tuple[GraphStep, ...] = (
    GraphStep("check: BatchNorm statistics order", _graph_only(check_batch_norm_order)),
    GraphStep("check: ONNX sequences", check_sequences),
    GraphStep("check: recurrent weights", check_recurrent_weights),
    GraphStep("pass: channels-last layout", _graph_only(to_channels_last), lambda settings: settings.channels_last),
    GraphStep("pass: packed q/k/v unbind", _graph_only(fuse_unbinds), lambda settings: settings.unbind),
    GraphStep("pass: attention fusion", _graph_only(fuse_attention), lambda settings: settings.fuse_attention),
    GraphStep("pass: bidirectional RNN split", _graph_only(split_bidirectional_rnns)),
    GraphStep("pass: loss log-probabilities", _graph_only(add_log_prob_outputs)),
    GraphStep("pass: constant-fill padding", _graph_only(pad_constant_fills)),
    GraphStep("pass: constant outputs computed", _graph_only(keep_constant_outputs_computed)),
    GraphStep("pass: gradient overloads", choose_overloads),
    GraphStep("pass: dimension names", _graph_only(sanitize_dim_names)),
)


def run_graph_steps(model: onnx.ModelProto, requiring_grad: list[str], settings: ModuleSettings) -> None:
    """Run :data:`GRAPH_STEPS` that apply under ``settings`` on ``model``, in order."""
    for step in GRAPH_STEPS:
        if step.applies(settings):
            step.run(model, requiring_grad)
