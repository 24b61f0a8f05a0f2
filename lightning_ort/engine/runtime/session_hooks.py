"""Hooks on ORT's inference sessions and graph runs: session options, the memory arena, the GPU allocator."""

from __future__ import annotations

import functools
from typing import Any

from lightning_ort.engine.runtime.memory_arena import arena_scope
from lightning_ort.engine.runtime.settings import attach, settings_of


def session_options_from_settings() -> None:
    """A module's sessions take its settings' config entries, thread count, profiler and log severity."""
    from onnxruntime.training.ortmodule._graph_execution_manager import GraphExecutionManager

    original = GraphExecutionManager._get_session_config

    @functools.wraps(original)
    def _get_session_config(self: Any) -> Any:
        session_options, providers, provider_options = original(self)
        settings = settings_of(self)
        for key, value in settings.session_entries.items():
            session_options.add_session_config_entry(key, value)
        if settings.intra_op_num_threads is not None:
            session_options.intra_op_num_threads = settings.intra_op_num_threads
        if settings.profile_file_prefix:
            session_options.enable_profiling = True
            session_options.profile_file_prefix = settings.profile_file_prefix
        # ORT sets int(LogLevel), one level off its own table (LogLevel.WARNING is severity ERROR)
        if settings.log_severity is not None:
            session_options.log_severity_level = settings.log_severity
        return session_options, providers, provider_options

    GraphExecutionManager._get_session_config = _get_session_config  # type: ignore[method-assign]


def graph_runs_in_memory_arena() -> None:
    """ORT's graph runs (training forward and backward, inference) of modules whose settings say
    ``memory_arena`` allocate the CPU memory of their torch kernels from the arena."""
    from onnxruntime.training.ortmodule._execution_agent import InferenceAgent, TrainingAgent
    from onnxruntime.training.ortmodule._inference_manager import InferenceManager
    from onnxruntime.training.ortmodule._training_manager import TrainingManager

    def in_arena(original: Any) -> Any:
        @functools.wraps(original)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            with arena_scope(settings_of(self).memory_arena):
                return original(self, *args, **kwargs)

        return run

    def marking_agent(original: Any) -> Any:
        @functools.wraps(original)
        def _create_execution_agent(self: Any) -> Any:
            result = original(self)
            attach(settings_of(self), self._execution_agent)
            return result

        return _create_execution_agent

    TrainingAgent.run_forward = in_arena(TrainingAgent.run_forward)  # type: ignore[method-assign]
    TrainingAgent.run_backward = in_arena(TrainingAgent.run_backward)  # type: ignore[method-assign]
    InferenceAgent.run_forward = in_arena(InferenceAgent.run_forward)  # type: ignore[method-assign]
    for manager in (TrainingManager, InferenceManager):
        manager._create_execution_agent = marking_agent(manager._create_execution_agent)  # type: ignore[method-assign]


def skip_gpu_allocator_without_cuda_provider() -> None:
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
