"""Class-level hooks into ORTModule 1.19.2, installed once when ORT is first loaded."""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any

from lightning_ort.engine.export.batchnorm_order import check_batch_norm_order
from lightning_ort.engine.export.export_cache import cache_directory, cache_entry, export_cache, keep_trace_record
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
from lightning_ort.engine.passes.gradient_paths import without_gradient_paths
from lightning_ort.engine.passes.unbind import fuse_unbinds
from lightning_ort.engine.runtime.memory_arena import arena_scope

log = logging.getLogger(__name__)

# Per-instance session settings are stored on ORT's execution managers under this attribute.
SESSION_ENTRIES_ATTR = "_lightning_ort_session_entries"
INTRA_OP_THREADS_ATTR = "_lightning_ort_intra_op_threads"
PROFILE_PREFIX_ATTR = "_lightning_ort_profile_prefix"
# Set on ORT's flattened module when its export should use op_rewrites.py's forms / the export cache.
OP_REWRITES_ATTR = "_lightning_ort_op_rewrites"
EXPORT_CACHE_ATTR = "_lightning_ort_export_cache"
# Set on ORT's execution managers whose graphs should hold convolution activations channels-last.
CHANNELS_LAST_ATTR = "_lightning_ort_channels_last"
# Set on ORT's execution managers whose graphs should split packed q/k/v projections with unbind.py.
UNBIND_ATTR = "_lightning_ort_unbind"
# Set on ORT's execution managers whose graphs should fuse attention written out by hand (attention_fusion.py).
ATTENTION_FUSION_ATTR = "_lightning_ort_attention_fusion"
# Set on ORT's execution managers (and copied to their agents) whose graph runs use memory_arena.py.
MEMORY_ARENA_ATTR = "_lightning_ort_memory_arena"


def _wrap_export() -> None:
    from onnxruntime.training.ortmodule._graph_transition_manager import GraphTransitionManager

    original = GraphTransitionManager.__dict__["_export_model"].__func__

    @functools.wraps(original)
    def _export_model(*args: Any, **kwargs: Any) -> Any:
        module = kwargs["flattened_module"]
        rewrites = getattr(module, OP_REWRITES_ATTR, False)
        directory = None
        if getattr(module, EXPORT_CACHE_ATTR, False):
            directory = cache_directory(
                module,
                kwargs["flatten_module_inputs"],
                kwargs["model_info_for_export"],
                kwargs["onnx_opset_version"],
                rewrites,
                kwargs["enable_custom_autograd_function"],
            )
        reused = False
        if directory is not None:
            directory, reused = cache_entry(directory, module)
        # never ORT's own cache (ORTMODULE_CACHE_DIR), keyed only by the printed module structure
        kwargs["ortmodule_cache_dir"] = str(directory) if directory is not None else ""
        with (
            export_cache(directory, kwargs["logger"]) as results,
            guarded_export(module),
            dynamic_attention_shapes(),
            exact_upsampling(),
            rewritten_symbolics(rewrites, kwargs["onnx_opset_version"]),
        ):
            results.append(original(*args, **kwargs))
        if directory is not None and not reused:
            keep_trace_record(directory, module)
        return results[-1]

    GraphTransitionManager._export_model = staticmethod(_export_model)  # type: ignore[method-assign]


def _prepare_graph_builder_input() -> None:
    """Each time ORT (re)builds its graphs: rewrite them (channels-last layers, packed q/k/v splits,
    attention written out by hand,
    losses.py's log-probabilities, concat_fills.py's padding), mark lightning_ort's nodes whose
    inputs need no gradient, and give symbolic dimensions names ORT's memory inspector can parse."""
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
        check_batch_norm_order(model)
        check_sequences(model, list(info.onnx_graph_input_names_require_grad))
        check_recurrent_weights(model, list(info.onnx_graph_input_names_require_grad))
        if getattr(self, CHANNELS_LAST_ATTR, False):
            to_channels_last(model)
        if getattr(self, UNBIND_ATTR, False):
            fuse_unbinds(model)
        if getattr(self, ATTENTION_FUSION_ATTR, False):
            fuse_attention(model)
        split_bidirectional_rnns(model)
        add_log_prob_outputs(model)
        pad_constant_fills(model)
        keep_constant_outputs_computed(model)
        choose_overloads(model, list(info.onnx_graph_input_names_require_grad))
        sanitize_dim_names(model)
        return original(self, info)

    GraphExecutionManager._initialize_graph_builder = _initialize_graph_builder  # type: ignore[method-assign]


def _wrap_session_config() -> None:
    from onnxruntime.training.ortmodule._graph_execution_manager import GraphExecutionManager

    original = GraphExecutionManager._get_session_config

    @functools.wraps(original)
    def _get_session_config(self: Any) -> Any:
        session_options, providers, provider_options = original(self)
        for key, value in getattr(self, SESSION_ENTRIES_ATTR, {}).items():
            session_options.add_session_config_entry(key, value)
        threads = getattr(self, INTRA_OP_THREADS_ATTR, None)
        if threads is not None:
            session_options.intra_op_num_threads = threads
        profile_prefix = getattr(self, PROFILE_PREFIX_ATTR, None)
        if profile_prefix:
            session_options.enable_profiling = True
            session_options.profile_file_prefix = profile_prefix
        return session_options, providers, provider_options

    GraphExecutionManager._get_session_config = _get_session_config  # type: ignore[method-assign]


def _graph_runs_in_memory_arena() -> None:
    """ORT's graph runs (training forward and backward, inference) of managers marked with
    MEMORY_ARENA_ATTR allocate the CPU memory of their torch kernels from the arena."""
    from onnxruntime.training.ortmodule._execution_agent import InferenceAgent, TrainingAgent
    from onnxruntime.training.ortmodule._inference_manager import InferenceManager
    from onnxruntime.training.ortmodule._training_manager import TrainingManager

    def in_arena(original: Any) -> Any:
        @functools.wraps(original)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            with arena_scope(getattr(self, MEMORY_ARENA_ATTR, False)):
                return original(self, *args, **kwargs)

        return run

    def marking_agent(original: Any) -> Any:
        @functools.wraps(original)
        def _create_execution_agent(self: Any) -> Any:
            result = original(self)
            setattr(self._execution_agent, MEMORY_ARENA_ATTR, getattr(self, MEMORY_ARENA_ATTR, False))
            return result

        return _create_execution_agent

    TrainingAgent.run_forward = in_arena(TrainingAgent.run_forward)  # type: ignore[method-assign]
    TrainingAgent.run_backward = in_arena(TrainingAgent.run_backward)  # type: ignore[method-assign]
    InferenceAgent.run_forward = in_arena(InferenceAgent.run_forward)  # type: ignore[method-assign]
    for manager in (TrainingManager, InferenceManager):
        manager._create_execution_agent = marking_agent(manager._create_execution_agent)  # type: ignore[method-assign]


def _skip_gpu_allocator_without_cuda_provider() -> None:
    """ORT imports its CUDA allocator extension whenever torch sees a GPU, even for a CPU model and a
    CPU-only ORT build, and fails. Without ORT's CUDA provider there is nothing to hand it to."""
    import onnxruntime
    from onnxruntime.training.ortmodule._graph_execution_manager import GraphExecutionManager

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        return

    def _get_torch_gpu_allocator_function_addresses(self: Any) -> None:
        return None

    GraphExecutionManager._get_torch_gpu_allocator_function_addresses = (  # type: ignore[method-assign]
        _get_torch_gpu_allocator_function_addresses
    )


def _symbolic_shapes_without_assumptions() -> None:
    """ORT's symbolic shape inference, less the dimensions it only assumed equal (shape_inference.py),
    and tolerating its failures: it asserts on some dynamic reshapes (nn.MultiheadAttention with a
    padding mask). It only annotates shapes, which ORT can also do without it (the runtime option
    ``run_symbolic_shape_infer=False``), so on failure the graph goes on unannotated."""
    from onnxruntime.training.ortmodule._graph_transition_manager import GraphTransitionManager

    from lightning_ort.engine.ops.kernels.shape_inference import infer_shapes
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


def _feature_table_at_info_level() -> None:
    """ORT logs a large feature table at WARNING after every graph build (training and inference).
    It is information, not a warning: show it at log_level="INFO" and below."""
    from onnxruntime.training.ortmodule._graph_execution_manager import GraphExecutionManager

    original = GraphExecutionManager._log_feature_stats

    @functools.wraps(original)
    def _log_feature_stats(self: Any) -> None:
        logger = self._logger
        logger.warning = logger.info  # instance attribute shadows Logger.warning for this call
        try:
            original(self)
        finally:
            del logger.warning

    GraphExecutionManager._log_feature_stats = _log_feature_stats  # type: ignore[method-assign]


def _buffers_in_reprocess_check() -> None:
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


def _frozen_parameters_need_no_gradient() -> None:
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


def _input_gradients_kept() -> None:
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


def _stream_suppression_without_file_descriptors() -> None:
    """ORT silences the exporter by redirecting the stdout/stderr file descriptors. Where
    ``sys.stdout`` has none (notebooks, IDE consoles, ``redirect_stdout(StringIO())``) that raised and
    the module fell back to PyTorch; there the output is simply not silenced."""
    import sys

    from onnxruntime.training.ortmodule import _logger

    original = _logger._suppress_os_stream_output

    def _has_descriptors() -> bool:
        try:
            return all(isinstance(stream.fileno(), int) for stream in (sys.stdout, sys.stderr))
        except (AttributeError, OSError, ValueError):
            return False

    @functools.wraps(original)
    def _suppress_os_stream_output(enable: bool = True, on_exit: Any = None) -> Any:
        if enable and not _has_descriptors():
            return contextlib.nullcontext()
        return original(enable=enable, on_exit=on_exit)

    _logger._suppress_os_stream_output = _suppress_os_stream_output


_GRAPH_DUMP = b"Torch IR graph at exception"


def _exporter_graph_dump_left_out() -> None:
    """A failed export prints torch's whole TorchScript graph (hundreds of lines), which ORT captures and logs
    as a warning with the rest of the exporter's output; the fallback's reason already names the failure.
    The graph is cut from that log (with ORT's ``log_level`` at INFO or below ORT captures nothing, and
    torch's output is printed whole)."""
    import io

    from onnxruntime.training.ortmodule import _logger

    original = _logger._log_with_filter

    @functools.wraps(original)
    def _log_with_filter(logger: logging.Logger, record_filters: Any, name: Any, fo: Any) -> None:
        end = fo.tell()
        fo.seek(0)
        content = fo.read()
        fo.seek(end)
        found = content.find(_GRAPH_DUMP)
        if found >= 0:
            kept = content[: content.rfind(b"\n", 0, found) + 1] + b"(torch's graph at the failure left out)\n"
            fo = io.BytesIO(kept)
            fo.seek(0, io.SEEK_END)
        original(logger, record_filters, name, fo)

    _logger._log_with_filter = _log_with_filter


def install() -> None:
    """Install all hooks (called once by the loader)."""
    from lightning_ort.engine.ops.kernels import (
        activations,
        batchnorm,
        distances,
        einsum,
        indexing,
        layers,
        math_ops,
        op_rewrites,
        pad_shuffle,
        pooling,
        reductions,
        rnn,
        sampling,
        special_functions,
        upsample,
    )
    from lightning_ort.engine.ops.symbolics import (
        attention,
        chunks,
        conv_padding,
        detach,
        feature_dropout,
        losses,
        matrix_transposes,
        onnx_gradients,
        random_ops,
        regression_losses,
        rnn_dropout,
        split_gradients,
        unflatten,
    )
    from lightning_ort.engine.passes import channels_last, unbind
    from lightning_ort.engine.runtime import backward_once, scalar_inputs

    attention.register()
    activations.register()
    pad_shuffle.register()
    math_ops.register()
    special_functions.register()
    matrix_transposes.register()
    losses.register()
    regression_losses.register()
    layers.register()
    indexing.register()
    distances.register()
    random_ops.register()
    feature_dropout.register()
    sampling.register()
    pooling.register()
    reductions.register()
    rnn.register()
    rnn_dropout.register()
    chunks.register()
    unflatten.register()
    einsum.register()
    onnx_gradients.register()
    channels_last.register_gradients()
    batchnorm.register()
    conv_padding.register()
    detach.register()
    split_gradients.register()
    op_rewrites.register_gradients()
    unbind.register_gradients()
    upsample.register()
    _wrap_export()
    _wrap_session_config()
    _graph_runs_in_memory_arena()
    _prepare_graph_builder_input()
    _symbolic_shapes_without_assumptions()
    _feature_table_at_info_level()
    _buffers_in_reprocess_check()
    _input_gradients_kept()
    _frozen_parameters_need_no_gradient()
    _stream_suppression_without_file_descriptors()
    _exporter_graph_dump_left_out()
    _skip_gpu_allocator_without_cuda_provider()
    backward_once.install()
    scalar_inputs.install()
