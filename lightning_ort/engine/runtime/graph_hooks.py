"""The hook on ORT's gradient-graph build: the inputs that need gradients, then the pipeline's graph steps."""

from __future__ import annotations

import functools
from typing import Any

from lightning_ort.engine.passes.gradient_paths import without_gradient_paths
from lightning_ort.engine.runtime.pipeline import run_graph_steps
from lightning_ort.engine.runtime.settings import settings_of


def graph_steps_before_gradient_build() -> None:
    """Each time ORT (re)builds its graphs: leave out of the gradient build the inputs no output's gradient
    reaches, then run :data:`~lightning_ort.engine.runtime.pipeline.GRAPH_STEPS` on the exported graph."""
    from onnxruntime.training.ortmodule._graph_execution_manager import GraphExecutionManager

    original = GraphExecutionManager._initialize_graph_builder

    @functools.wraps(original)
    def _initialize_graph_builder(self: Any, info: Any) -> Any:
        model = info._post_export_processed_model
        if any(node.op_type == "PythonOp" for node in model.graph.node):
            from lightning_ort.engine.bootstrap.custom_function import ensure_runner

            ensure_runner()  # usually done already by the export guard, which falls back if it cannot be built
        unreachable = without_gradient_paths(model, list(info.onnx_graph_input_names_require_grad))
        if unreachable:  # eager leaves their gradients None; ORT refused to build them
            info.onnx_graph_input_names_require_grad = [
                name for name in info.onnx_graph_input_names_require_grad if name not in unreachable
            ]
        # ORT's reprocess check updates which inputs require grad but not its user-input subset, so a
        # model input that stops requiring grad (FGSM's second forward) was still asked for a gradient
        required = set(info.onnx_graph_input_names_require_grad)
        info.onnx_graph_input_names_require_grad_user_defined = [
            name for name in info.onnx_graph_input_names_user_defined if name in required
        ]
        run_graph_steps(model, list(info.onnx_graph_input_names_require_grad), settings_of(self))
        return original(self, info)

    GraphExecutionManager._initialize_graph_builder = _initialize_graph_builder  # type: ignore[method-assign]
