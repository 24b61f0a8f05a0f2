"""What lightning_ort checks and restores around ORT's ONNX export of a module: the recorders it enters
(:data:`RECORDERS`, in nesting order) and the checks it asks (:data:`EXPORT_CHECKS`, in refusal order).
Each check, its recorder and its message live together in ``checks/``."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch

from lightning_ort.engine.export import hf_attention, traced_numbers
from lightning_ort.engine.export.checks import (
    buffer_writes,
    checkpointed_norms,
    custom_functions,
    forward_side_effects,
    frozen_numbers,
    grad_modes,
    module_patterns,
    python_random_draws,
    traced_call_checks,
    tracer_warnings,
)
from lightning_ort.engine.export.checks.export_check import ExportCheck, ExportContext, Recorder
from lightning_ort.engine.export.guards import python_reads, size_guards
from lightning_ort.engine.export.python_state import PythonState
from lightning_ort.engine.export.torchscript_export import torchscript_exporter
from lightning_ort.engine.export.user_code import adapter_of, user_frame, user_modules
from lightning_ort.engine.export.value_traces import exporting
from lightning_ort.errors import ORTUnsupportedModelError

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _random_states_kept() -> Iterator[None]:
    """Python's, NumPy's and torch's random states as they were before the block, also when it raises.

    The trace runs ``forward``, whose dropout draws from torch's generator. ORT puts the states back after
    an export that succeeds only; after one that fails, the module's calls in PyTorch drew other numbers
    than the same run without ORT would."""
    from onnxruntime.training.ortmodule import _utils

    states = _utils.get_random_states()
    try:
        yield
    finally:
        _utils.set_random_states(states)


@contextlib.contextmanager
def attention_fast_path_off() -> Iterator[None]:
    """Trace nn.MultiheadAttention / nn.TransformerEncoder through their standard (math) path.

    In eval mode without grad, PyTorch takes fused fast paths (``_transformer_encoder_layer_fwd``,
    nested tensors) that ONNX cannot express. The standard path computes the same function; the one
    visible difference is that positions masked by ``src_key_padding_mask`` hold computed values
    instead of the fast path's zeros.
    """
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


# Recorders that refuse nothing themselves: they make the export right, or record what later calls need
_RANDOM_STATES = Recorder("random_states", lambda context: _random_states_kept())
_EXPORTING = Recorder("exporting", lambda context: exporting(context.module))
_PYTHON_READS = Recorder(
    "python_reads",
    lambda context: python_reads.recorded_reads(
        python_reads.reads_of(adapter_of(context.module)), user_modules(context.module)
    ),
)
_FIXED_SIZE_NUMBERS = Recorder("fixed_size_numbers", lambda context: traced_numbers.fixed_size_numbers())
_SIZE_DECISIONS = Recorder(
    "size_decisions", lambda context: size_guards.recorded_decisions(adapter_of(context.module), user_frame)
)
_TORCHSCRIPT_EXPORTER = Recorder("torchscript_exporter", lambda context: torchscript_exporter(context.exported))
_ATTENTION_FAST_PATH_OFF = Recorder("attention_fast_path_off", lambda context: attention_fast_path_off())
_EXPORTED_SDPA = Recorder("exported_sdpa", lambda context: hf_attention.exported_sdpa())

# Entered in this order around ORT's export (and left in reverse). A recorder may read those before it:
# traced calls read the warnings; grad regions read the input copies and tell the traced calls.
RECORDERS: tuple[Recorder, ...] = (
    forward_side_effects.PARAMETER_VERSIONS,
    _RANDOM_STATES,
    _EXPORTING,
    buffer_writes.BUFFERS,
    buffer_writes.BATCH_NORM_CALLS,
    _PYTHON_READS,
    frozen_numbers.INDEX_CONVERSIONS,
    tracer_warnings.WARNINGS,
    traced_call_checks.TRACED_CALLS,
    frozen_numbers.ITERATIONS,
    _FIXED_SIZE_NUMBERS,
    _SIZE_DECISIONS,
    forward_side_effects.INPUT_COPIES,
    _TORCHSCRIPT_EXPORTER,
    _ATTENTION_FAST_PATH_OFF,
    _EXPORTED_SDPA,
    custom_functions.AUTOGRAD_FUNCTIONS,
    grad_modes.GRAD_REGIONS,
    forward_side_effects.STORED_TENSORS,
    python_random_draws.RANDOM_DRAWS,
    checkpointed_norms.CHECKPOINTED_NORMS,
)

# Asked in this order; the first problem found is the refusal. Checks ``before_export`` run before any
# recorder is entered; when ORT's export itself raised, the first ``failure`` message replaces its error.
EXPORT_CHECKS: tuple[ExportCheck, ...] = (
    module_patterns.CUMULATIVE_BATCH_NORM,
    module_patterns.SPARSE_EMBEDDINGS,
    module_patterns.SPECTRAL_NORMS,
    traced_call_checks.UNSUPPORTED_CALLS,
    custom_functions.REENTRANT_CHECKPOINT,
    custom_functions.CUSTOM_FUNCTIONS,
    grad_modes.GRAD_SWITCHED_OFF,
    grad_modes.NO_GRAD_REGIONS,
    checkpointed_norms.CHECKPOINTED_RUNNING_STATISTICS,
    python_random_draws.PYTHON_RANDOM_DRAWS,
    forward_side_effects.TENSORS_STORED_ON_MODULE,
    forward_side_effects.PYTHON_ATTRIBUTES,
    buffer_writes.BUFFER_UPDATES,
    buffer_writes.REPLACED_BUFFERS,
    forward_side_effects.PARAMETERS_IN_PLACE,
    forward_side_effects.INPUTS_IN_PLACE,
    frozen_numbers.INDEX_CONVERSION,
    traced_call_checks.SIZE_TENSORS,
    frozen_numbers.VARYING_ITERATIONS,
    traced_call_checks.COUNTED_SPLITS,
    tracer_warnings.NUMBER_OUTPUT,
    tracer_warnings.DATA_DEPENDENT,
)


@contextlib.contextmanager
def guarded_export(module: torch.nn.Module) -> Iterator[None]:
    """Run ORT's export of ``module`` safely (:func:`_guarded_export`); when it fails or is refused, put the
    Python state its forward runs changed back, since PyTorch runs this step's forward again."""
    state = PythonState(user_modules(module))
    try:
        with _guarded_export(module, state):
            yield
    except Exception:
        state.restore()
        raise


@contextlib.contextmanager
def _guarded_export(module: torch.nn.Module, state: PythonState) -> Iterator[None]:
    """Run ORT's export of ``module`` inside :data:`RECORDERS`, and refuse it with
    :class:`ORTUnsupportedModelError` at the first of :data:`EXPORT_CHECKS` that finds a problem (a module
    whose graph would not train as in PyTorch). The export uses the TorchScript exporter and leaves the
    module's buffers as they were."""
    context = ExportContext(module, state)
    _refuse_first(context, [check for check in EXPORT_CHECKS if check.before_export])
    with contextlib.ExitStack() as stack:
        for recorder in RECORDERS:
            context.records[recorder] = stack.enter_context(recorder.enter(context))
        try:
            yield
        except Exception as error:
            for check in EXPORT_CHECKS:
                message = check.failure(context, error) if check.failure is not None else None
                if message is not None:
                    # ORT's own message blames export in general; fallback reports show the root cause only
                    log.debug("ORT's export failed; refused by the %s check", check.name, exc_info=error)
                    raise ORTUnsupportedModelError(message) from None
            raise
    tracer_warnings.reemit(context[tracer_warnings.WARNINGS])
    _refuse_first(context, [check for check in EXPORT_CHECKS if not check.before_export])
    size_guards.keep_decisions(adapter_of(module), context[_SIZE_DECISIONS], context.exported.traced)


def _refuse_first(context: ExportContext, checks: list[ExportCheck]) -> None:
    for check in checks:
        message = check.problem(context) if check.problem is not None else None
        if message is not None:
            raise ORTUnsupportedModelError(message)
