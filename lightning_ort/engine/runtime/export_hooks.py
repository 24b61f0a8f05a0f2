"""Hooks on ORT's graph transition manager: the export, shape inference and the per-call reprocess check."""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any

from lightning_ort.engine.export.export_cache import cache_directory, cache_entry, export_cache, keep_trace_record
from lightning_ort.engine.runtime.pipeline import EXPORT_CONTEXTS
from lightning_ort.engine.runtime.settings import settings_of

log = logging.getLogger(__name__)


def export_in_pipeline() -> None:
    """ORT's export runs inside the export cache and :data:`~lightning_ort.engine.runtime.pipeline.EXPORT_CONTEXTS`."""
    from onnxruntime.training.ortmodule._graph_transition_manager import GraphTransitionManager

    original = GraphTransitionManager.__dict__["_export_model"].__func__

    @functools.wraps(original)
    def _export_model(*args: Any, **kwargs: Any) -> Any:
        module = kwargs["flattened_module"]
        settings = settings_of(module)
        opset = kwargs["onnx_opset_version"]
        directory = None
        if settings.export_cache:
            directory = cache_directory(
                module,
                kwargs["flatten_module_inputs"],
                kwargs["model_info_for_export"],
                opset,
                settings.op_rewrites,
                kwargs["enable_custom_autograd_function"],
            )
        reused = False
        if directory is not None:
            directory, reused = cache_entry(directory, module)
        # never ORT's own cache (ORTMODULE_CACHE_DIR), keyed only by the printed module structure
        kwargs["ortmodule_cache_dir"] = str(directory) if directory is not None else ""
        with contextlib.ExitStack() as stack:
            results = stack.enter_context(export_cache(directory, kwargs["logger"]))
            for context in EXPORT_CONTEXTS:
                stack.enter_context(context.enter(module, settings, opset))
            results.append(original(*args, **kwargs))
        if directory is not None and not reused:
            keep_trace_record(directory, module)
        return results[-1]

    GraphTransitionManager._export_model = staticmethod(_export_model)  # type: ignore[method-assign]


def frozen_parameters_need_no_gradient() -> None:
    """ORT's export lists every parameter as needing a gradient, ``requires_grad`` or not (the next call's
    check corrects it); a frozen teacher inside ``forward`` whose output is detached then failed the first
    gradient build ("Cannot compute the partial derivative ... as it's unreachable"). The export's list
    leaves frozen parameters out, as that check would."""
    from onnxruntime.training.ortmodule._graph_transition_manager import GraphTransitionManager

    original = GraphTransitionManager.__dict__["_export_model"].__func__

    @functools.wraps(original)
    def _export_model(*args: Any, flattened_module: Any, **kwargs: Any) -> Any:
        exported_model, schema, names, require_grad = original(*args, flattened_module=flattened_module, **kwargs)
        frozen = {name for name, parameter in flattened_module.named_parameters() if not parameter.requires_grad}
        return exported_model, schema, names, [name for name in require_grad if name not in frozen]

    GraphTransitionManager._export_model = staticmethod(_export_model)  # type: ignore[method-assign]


def symbolic_shapes_without_assumptions() -> None:
    """ORT's symbolic shape inference, less the dimensions it only assumed equal (shape_inference.py),
    and tolerating its failures: it asserts on some dynamic reshapes (nn.MultiheadAttention with a
    padding mask). It only annotates shapes, which ORT can also do without it (the runtime option
    ``run_symbolic_shape_infer=False``), so on failure the graph goes on unannotated."""
    from onnxruntime.training.ortmodule._graph_transition_manager import GraphTransitionManager

    from lightning_ort.engine.ops.kernels.shape_inference import infer_shapes  # imports onnxruntime
    from lightning_ort.engine.passes.shared_masks import share_mask_indices

    original = GraphTransitionManager.__dict__["_infer_shapes"].__func__

    @functools.wraps(original)
    def _infer_shapes(model: Any) -> Any:
        share_mask_indices(model)
        try:
            return infer_shapes(model)
        except Exception:
            log.debug("ORT's symbolic shape inference failed; continuing without it", exc_info=True)
            return model

    GraphTransitionManager._infer_shapes = staticmethod(_infer_shapes)  # type: ignore[method-assign]


def buffers_in_reprocess_check() -> None:
    """With ORT's per-step checks on, ``_reprocess_check`` asserts that every graph input that is
    not a user input is a parameter, and fails on buffers (BatchNorm statistics). Buffers never
    require grad, so the check runs on the other inputs."""
    from onnxruntime.training.ortmodule._graph_transition_manager import GraphTransitionManager

    original = GraphTransitionManager.__dict__["_reprocess_check"].__func__

    @functools.wraps(original)
    def _reprocess_check(*, flatten_module: Any, exported_model_info: Any, **kwargs: Any) -> Any:
        buffers = {name for name, _ in flatten_module.named_buffers()}
        names = exported_model_info.onnx_graph_input_names
        exported_model_info.onnx_graph_input_names = [name for name in names if name not in buffers]
        try:
            return original(flatten_module=flatten_module, exported_model_info=exported_model_info, **kwargs)
        finally:
            exported_model_info.onnx_graph_input_names = names

    GraphTransitionManager._reprocess_check = staticmethod(_reprocess_check)  # type: ignore[method-assign]


def input_gradients_kept() -> None:
    """Once a model input has required grad, ORT's graph keeps computing its gradient when a later
    call's input does not (torch drops a gradient returned for such an input). Adversarial training
    alternates every forward, and each change rebuilt ORT's graphs (about 5 ms each on a small MLP)."""
    from onnxruntime.training.ortmodule._graph_transition_manager import GraphTransitionManager

    original = GraphTransitionManager.__dict__["_reprocess_check"].__func__

    @functools.wraps(original)
    def _reprocess_check(*, exported_model_info: Any, **kwargs: Any) -> Any:
        changed, required = original(exported_model_info=exported_model_info, **kwargs)
        built = set(exported_model_info.onnx_graph_input_names_require_grad)
        inputs = set(exported_model_info.onnx_graph_input_names_user_defined)
        if changed and set(required) <= built and built - set(required) <= inputs:
            return False, []
        return changed, required

    GraphTransitionManager._reprocess_check = staticmethod(_reprocess_check)  # type: ignore[method-assign]
