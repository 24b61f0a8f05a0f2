"""lightning_ort's engine: everything that touches ONNX Runtime's internals lives here.

The rest of lightning_ort (the Lightning layer: strategy, guard, wrapping, callbacks) talks to the names this
facade exports (:func:`wrap_module`, :class:`ORTRuntimeOptions`, ...); ORT's environment variables, private
attributes and torch compatibility shims stay inside this package. Its folders are layers, bottom to top,
each importing only from its own layer and those below it (``tests/test_architecture.py``,
``docs/architecture.md``):

- ``bootstrap``: make ORT importable on this torch, build and load the C++ extensions (``csrc/``);
- ``ops``: op coverage, what each torch op becomes in ORT's graph (``kernels``, ``symbolics``);
- ``passes``: rewrites of the exported ONNX graph;
- ``export``: ORT's export and the checks that refuse what ORT would train wrongly;
- ``runtime``: ORTModule's lifecycle (hooks into ORT, options, memory arena, logs).

This module sits above them all, and is the one place that wires a lower layer to a higher one.
"""

from lightning_ort.engine.bootstrap import custom_function as _custom_function
from lightning_ort.engine.bootstrap import extensions as _extensions
from lightning_ort.engine.bootstrap import loader as _loader
from lightning_ort.engine.bootstrap.custom_function import custom_function_support, custom_function_support_enabled
from lightning_ort.engine.bootstrap.flavour import check_device, check_installation
from lightning_ort.engine.bootstrap.loader import ortmodule_package
from lightning_ort.engine.export.export_guard import attention_fast_path_off
from lightning_ort.engine.export.guards.module_hooks import hooks_problem, refresh_hooked_weights, summary_hooks
from lightning_ort.engine.export.guards.python_reads import changed_read as changed_python_read
from lightning_ort.engine.export.guards.python_reads import forget_reads as forget_python_reads
from lightning_ort.engine.export.guards.size_guards import changed_decision as changed_size_decision
from lightning_ort.engine.export.guards.size_guards import forget_graph as forget_size_decisions
from lightning_ort.engine.ops.kernels.batchnorm import advance_batch_counters, batch_counters
from lightning_ort.engine.ops.kernels.gradient_overloads import aten_operator
from lightning_ort.engine.runtime import hooks as _hooks
from lightning_ort.engine.runtime.deploy import (
    ArtifactLoss,
    ArtifactOptimizer,
    check_training_artifacts,
    generate_training_artifacts,
    non_standard_ops,
    remove_training_symbolics,
    standard_onnx_symbolics,
)
from lightning_ort.engine.runtime.graphs import GRAPH_STAGES, GraphStage, save_graphs, saved_graph_path
from lightning_ort.engine.runtime.logs import (
    LOG_LEVELS,
    NATIVE_LOGGER,
    PYTHON_LOGGER,
    LogLevelName,
    NativeLogCapture,
    PythonLogRoute,
    python_level,
    set_log_level,
    set_python_log_level,
)
from lightning_ort.engine.runtime.memory_arena import ArenaStats
from lightning_ort.engine.runtime.memory_arena import arena_scope as memory_arena_scope
from lightning_ort.engine.runtime.memory_arena import release as release_memory_arena
from lightning_ort.engine.runtime.memory_arena import stats as memory_arena_stats
from lightning_ort.engine.runtime.ortmodule import (
    ORTRuntimeOptions,
    backward_pending,
    end_profiling,
    export_again,
    exported_model,
    memory_optimization_level,
    processed_model,
    read_module_tensors_again,
    recompute_plans,
    set_training_flag,
    wrap_module,
)

# The lower modules take what sits above them by registration, so that no import goes back up:
# the loader installs the hooks into ORT once it imports ORT, and the extensions register the custom-Function
# runner's interop module under the name ORT imports.
_loader.run_after_import(_hooks.install)
_extensions.provide_interop_module(_custom_function.interop_module)

__all__ = [
    "GRAPH_STAGES",
    "LOG_LEVELS",
    "NATIVE_LOGGER",
    "PYTHON_LOGGER",
    "ArtifactLoss",
    "ArtifactOptimizer",
    "ArenaStats",
    "GraphStage",
    "LogLevelName",
    "NativeLogCapture",
    "ORTRuntimeOptions",
    "PythonLogRoute",
    "advance_batch_counters",
    "aten_operator",
    "attention_fast_path_off",
    "backward_pending",
    "batch_counters",
    "changed_python_read",
    "changed_size_decision",
    "forget_size_decisions",
    "forget_python_reads",
    "check_device",
    "check_installation",
    "check_training_artifacts",
    "custom_function_support",
    "custom_function_support_enabled",
    "end_profiling",
    "export_again",
    "read_module_tensors_again",
    "refresh_hooked_weights",
    "exported_model",
    "processed_model",
    "generate_training_artifacts",
    "hooks_problem",
    "summary_hooks",
    "memory_arena_scope",
    "memory_arena_stats",
    "memory_optimization_level",
    "non_standard_ops",
    "ortmodule_package",
    "python_level",
    "recompute_plans",
    "release_memory_arena",
    "save_graphs",
    "saved_graph_path",
    "set_log_level",
    "set_python_log_level",
    "set_training_flag",
    "standard_onnx_symbolics",
    "remove_training_symbolics",
    "wrap_module",
]
