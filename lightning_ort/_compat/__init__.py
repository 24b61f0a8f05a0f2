"""Everything that touches ONNX Runtime's internals lives here.

The rest of lightning_ort talks to :func:`wrap_module` and :class:`ORTRuntimeOptions`; ORT's
environment variables, private attributes and torch compatibility shims stay inside this package.
"""

from lightning_ort._compat import custom_function as _custom_function
from lightning_ort._compat import extensions as _extensions
from lightning_ort._compat import loader as _loader
from lightning_ort._compat import patches as _patches
from lightning_ort._compat.batchnorm import advance_batch_counters, batch_counters
from lightning_ort._compat.custom_function import custom_function_support, custom_function_support_enabled
from lightning_ort._compat.deploy import (
    ArtifactLoss,
    ArtifactOptimizer,
    check_training_artifacts,
    generate_training_artifacts,
    non_standard_ops,
    remove_training_symbolics,
    standard_onnx_symbolics,
)
from lightning_ort._compat.export_guard import attention_fast_path_off
from lightning_ort._compat.flavour import check_device, check_installation
from lightning_ort._compat.gradient_overloads import aten_operator
from lightning_ort._compat.graphs import GRAPH_STAGES, GraphStage, save_graphs, saved_graph_path
from lightning_ort._compat.loader import ortmodule_package
from lightning_ort._compat.logs import (
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
from lightning_ort._compat.memory_arena import ArenaStats
from lightning_ort._compat.memory_arena import arena_scope as memory_arena_scope
from lightning_ort._compat.memory_arena import release as release_memory_arena
from lightning_ort._compat.memory_arena import stats as memory_arena_stats
from lightning_ort._compat.python_reads import changed_read as changed_python_read
from lightning_ort._compat.python_reads import forget_reads as forget_python_reads
from lightning_ort._compat.runtime import (
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
from lightning_ort._compat.size_guards import changed_decision as changed_size_decision
from lightning_ort._compat.size_guards import forget_graph as forget_size_decisions
from lightning_ort._compat.trace_checks import hooks_problem, refresh_hooked_weights, summary_hooks

# The lower modules take what sits above them by registration, so that no import goes back up:
# the loader installs the hooks into ORT once it imports ORT, and the extensions register the custom-Function
# runner's interop module under the name ORT imports.
_loader.run_after_import(_patches.install)
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
