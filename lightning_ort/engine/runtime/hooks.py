"""The one place that installs lightning_ort into ORT, once, when ORT is first loaded: the op families'
symbolics and gradients, then the hooks on ORT's methods, in the order of :data:`HOOKS`.

Where two hooks wrap the same ORT method, the later one in :data:`HOOKS` wraps the earlier one, so it runs
first and sees the other's result. ``tests/test_ort_registries.py`` compares what this installs (the
registries' entries and each method's chain of hooks) with a recorded snapshot.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from lightning_ort.engine.ops import registry
from lightning_ort.engine.runtime import (
    backward_once,
    export_hooks,
    graph_hooks,
    log_hooks,
    scalar_inputs,
    session_hooks,
)


@dataclass(frozen=True)
class Hook:
    """A hook into ORT: what it wraps, and the function that installs it."""

    wraps: str  # ORT's methods or functions it wraps or replaces
    install: Callable[[], None]


HOOKS: tuple[Hook, ...] = (
    Hook("GraphTransitionManager._export_model", export_hooks.export_in_pipeline),
    Hook("GraphExecutionManager._get_session_config", session_hooks.session_options_from_settings),
    Hook(
        "TrainingAgent/InferenceAgent runs, *Manager._create_execution_agent", session_hooks.graph_runs_in_memory_arena
    ),
    Hook("GraphExecutionManager._initialize_graph_builder", graph_hooks.graph_steps_before_gradient_build),
    Hook("GraphTransitionManager._infer_shapes", export_hooks.symbolic_shapes_without_assumptions),
    Hook("GraphExecutionManager._log_feature_stats", log_hooks.feature_table_at_info_level),
    Hook("GraphTransitionManager._reprocess_check", export_hooks.buffers_in_reprocess_check),
    # after the buffers' hook: it sees the check's answer with buffers left out
    Hook("GraphTransitionManager._reprocess_check", export_hooks.input_gradients_kept),
    # around the export in the pipeline: it filters the names that export returns
    Hook("GraphTransitionManager._export_model", export_hooks.frozen_parameters_need_no_gradient),
    Hook("_logger._suppress_os_stream_output", log_hooks.stream_suppression_without_file_descriptors),
    Hook("_logger._log_with_filter", log_hooks.exporter_graph_dump_left_out),
    Hook(
        "GraphExecutionManager._get_torch_gpu_allocator_function_addresses",
        session_hooks.skip_gpu_allocator_without_cuda_provider,
    ),
    Hook("TrainingManager._create_autofunction_class, TrainingManager.forward", backward_once.install),
    # outermost on _export_model and _reprocess_check: Python number arguments, before anything else sees them
    Hook("_io.unflatten_data_using_schema, _reprocess_check, _export_model", scalar_inputs.install),
)


def install() -> None:
    """Register the op families with ORT (:data:`~lightning_ort.engine.ops.registry.FAMILIES`, in order), then
    install :data:`HOOKS` in order (called once by the loader)."""
    for module, function in registry.FAMILIES:
        getattr(importlib.import_module(f"lightning_ort.engine.{module}"), function)()
    for hook in HOOKS:
        hook.install()
