"""Checks on torch's TracerWarnings: Python control flow or values that depend on tensor data, and Python
numbers among forward's outputs, which the trace freezes. The recorder of warnings is shared (traced
calls attribute theirs to the caller's line, ``traced_calls.py``)."""

from __future__ import annotations

import ast
import contextlib
import functools
import linecache
import os
import warnings
from collections.abc import Iterator

import torch

from lightning_ort.engine.export.checks.export_check import ExportCheck, ExportContext, Recorder
from lightning_ort.engine.export.traced_calls import ORT_DIR

# TorchScript tracing records one path through Python control flow that reads tensor values, and
# freezes such values as constants: the ORT graph would then compute something else than the module.
_UNSAFE_TRACER_PHRASES = (
    "might cause the trace to be incorrect",
    "registered as constants in the trace",
    "trace might not generalize",
)
# int(), float() or math of a size read from the input is such a value too, since the export traces sizes as tensors
_SIZES_ARE_TENSORS = (
    " (if it is a size: under the export a size such as x.shape[0] is a tensor too, so int(x.shape[0] / 4) or "
    "math.sqrt(x.size(1)) "
    "freezes the first batch's number. Fix: keep it a tensor (x.shape[0] // 4, x.size(1) ** 0.5), or compute it "
    "from a number the module keeps)"
)
_BRANCH_ON_SIZES = (
    "its forward has Python control flow on sizes at {location} ({line}): under the export sizes are tensors, "
    "and the graph would keep the branch the first batch took (lightning_ort checks such a branch on every call "
    "only where it can compute its sizes from forward's inputs). Fix: take the branch on every call (compute both "
    "sides with tensor operations, torch.where), or keep that module out of ORT with ORTStrategy(modules=[...])"
)
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_ONNX_DIR = os.path.join(_TORCH_DIR, "onnx") + os.sep
# ORT turns Python numbers among forward's outputs into tensors here, under the trace (a TracerWarning)
_ORT_OUTPUT_FLATTENING = os.path.join(ORT_DIR, "training", "utils", "torch_io_helper.py")
_NUMBER_OUTPUT = (
    "its forward returns a Python number (int, float or bool) among its outputs; ORT's graph has tensor outputs "
    "only, and the export would freeze that number at its first value. Fix: return tensors only (compute the "
    "number with tensor operations), or compute the number outside forward (in training_step)"
)


@contextlib.contextmanager
def _recorded_warnings() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always", torch.jit.TracerWarning)
        yield records


WARNINGS = Recorder("warnings", lambda context: _recorded_warnings())


def reemit(records: list[warnings.WarningMessage]) -> None:
    """After the export: warn again what the user's code warned (not the tracer's warnings, which the checks
    read, nor the exporter's own deprecation and graph-rewrite notes, which are about ORT's export call)."""
    for record in records:
        if not issubclass(record.category, torch.jit.TracerWarning) and not record.filename.startswith(_ONNX_DIR):
            warnings.warn_explicit(record.message, record.category, record.filename, record.lineno)


# Which source lines hold the condition of an ``assert`` statement, or of an ``if`` that only raises:
# nanoGPT checks ``assert t <= self.config.block_size`` in forward. Under the export ``t`` is a tensor,
# and the check converts it to a Python boolean with a TracerWarning, which the export guard otherwise
# refuses (the branch taken would be frozen). An assertion has no branch to freeze: when it holds, the
# graph is the same as without it. Hugging Face's attention classes (transformers <= 4.37: Llama,
# Mistral, BART, Whisper, CLIP) check ``if attn_weights.size() != (bsz, heads, q, k): raise
# ValueError(...)``, the same check written out. Neither is checked again on later batches (ORT's graph
# holds no assertion), which the FAQ says.


def in_assert_condition(filename: str, lineno: int) -> bool:
    """Whether line ``lineno`` of ``filename`` lies in the condition of an ``assert`` statement, or of an
    ``if`` statement whose body only raises (no ``else``)."""
    return any(first <= lineno <= last for first, last in _assert_conditions(filename))


@functools.lru_cache(maxsize=256)
def _assert_conditions(filename: str) -> tuple[tuple[int, int], ...]:
    source = "".join(linecache.getlines(filename))
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ()
    return tuple(
        (node.test.lineno, node.test.end_lineno or node.test.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assert) or (isinstance(node, ast.If) and _only_raises(node))
    )


def _only_raises(node: ast.If) -> bool:
    return not node.orelse and all(isinstance(statement, ast.Raise) for statement in node.body)


def _is_unsafe_tracer_warning(record: warnings.WarningMessage) -> bool:
    # torch's own modules convert tensors to Python values only to validate inputs
    # (e.g. BatchNorm's batch-size check); the user's code is what can branch on data.
    if not issubclass(record.category, torch.jit.TracerWarning) or record.filename.startswith(_TORCH_DIR):
        return False
    text = str(record.message)
    if "boolean" in text and in_assert_condition(record.filename, record.lineno):
        return False  # an assertion that held: the graph is the same without it
    return any(phrase in text for phrase in _UNSAFE_TRACER_PHRASES)


def unsafe_warnings(context: ExportContext) -> list[warnings.WarningMessage]:
    """The TracerWarnings of the user's code that say the trace froze a value."""
    return [record for record in context[WARNINGS] if _is_unsafe_tracer_warning(record)]


def _number_output(context: ExportContext) -> str | None:
    unsafe = unsafe_warnings(context)
    return _NUMBER_OUTPUT if any(record.filename == _ORT_OUTPUT_FLATTENING for record in unsafe) else None


def _reads_sizes(filename: str, lineno: int) -> bool:
    """Whether the source line reads a tensor's sizes (``.shape``, ``.size(``)."""
    line = linecache.getline(filename, lineno)
    return ".shape" in line or ".size(" in line


def _data_dependent(context: ExportContext) -> str | None:
    unsafe = unsafe_warnings(context)
    if not unsafe:
        return None
    first = unsafe[0]
    text = str(first.message)
    if "boolean" in text and _reads_sizes(first.filename, first.lineno):  # the hint in place of torch's text
        line = linecache.getline(first.filename, first.lineno).strip()
        return _BRANCH_ON_SIZES.format(location=f"{first.filename}:{first.lineno}", line=line or "source not found")
    sizes = _SIZES_ARE_TENSORS if "Converting a tensor to a Python" in text and "boolean" not in text else ""
    return (
        "its forward has Python control flow or values that depend on tensor data, which the ONNX "
        f"export would freeze ({first.filename}:{first.lineno}: {first.message}){sizes}"
    )


NUMBER_OUTPUT = ExportCheck("number_output", _number_output, reads=(WARNINGS,))
DATA_DEPENDENT = ExportCheck("data_dependent", _data_dependent, reads=(WARNINGS,))
