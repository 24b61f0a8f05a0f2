"""Everything that touches ONNX Runtime's internals lives here.

The rest of lightning_ort talks to :func:`wrap_module` and :class:`ORTRuntimeOptions`; ORT's
environment variables, private attributes and torch compatibility shims stay inside this package.
"""

from lightning_ort._compat.batchnorm import advance_batch_counters, batch_counters
from lightning_ort._compat.custom_function import custom_function_support, custom_function_support_enabled
from lightning_ort._compat.flavour import check_device, check_installation
from lightning_ort._compat.loader import ort_module_class, ortmodule_package
from lightning_ort._compat.runtime import (
    ORTRuntimeOptions,
    exported_model,
    memory_optimization_level,
    recompute_plans,
    set_training_flag,
    wrap_module,
)

__all__ = [
    "ORTRuntimeOptions",
    "advance_batch_counters",
    "batch_counters",
    "check_device",
    "check_installation",
    "custom_function_support",
    "custom_function_support_enabled",
    "exported_model",
    "memory_optimization_level",
    "ort_module_class",
    "ortmodule_package",
    "recompute_plans",
    "set_training_flag",
    "wrap_module",
]
