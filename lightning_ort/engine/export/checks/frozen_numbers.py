"""Checks on Python numbers the trace freezes at the first batch's value: a tensor (or a size) turned into an
index, and an iteration over a dimension whose size changes (random draws: ``python_random_draws.py``)."""

from __future__ import annotations

from lightning_ort.engine.export import traced_numbers
from lightning_ort.engine.export.checks.export_check import ExportCheck, ExportContext, Recorder
from lightning_ort.engine.export.user_code import user_frame

INDEX_CONVERSIONS = Recorder("index_conversions", lambda context: traced_numbers.index_conversions(user_frame))
ITERATIONS = Recorder("iterations", lambda context: traced_numbers.varying_iterations(user_frame))


def _index_conversions(context: ExportContext) -> str | None:
    conversions = context[INDEX_CONVERSIONS]
    if not conversions:
        return None
    return (
        "its forward turns a tensor (under ONNX export, also a size such as x.shape[1]) into a Python integer "
        f"at {conversions[0]} (range(), an index); the export freezes that number, so a loop over a "
        "dimension would stay unrolled for the first batch's size. Fix: use tensor operations over the whole "
        "dimension, or keep that module out of ORT with ORTStrategy(modules=[...])"
    )


def _iterations(context: ExportContext) -> str | None:
    iterations = context[ITERATIONS]
    if not iterations:
        return None
    return (
        f"its forward iterates over a tensor at {iterations[0]} (q, k, v = qkv, for row in x) whose first "
        "dimension can change size between batches (the batch or sequence dimension); the export keeps one "
        "part per element of the first batch. Fix: iterate over a dimension of constant size (one a reshape "
        "or view sets with a number, as in qkv.reshape(B, T, 3, H, D).permute(2, 0, 3, 1, 4)), or use "
        "tensor operations over the whole dimension"
    )


INDEX_CONVERSION = ExportCheck("index_conversions", _index_conversions, reads=(INDEX_CONVERSIONS,))
VARYING_ITERATIONS = ExportCheck("varying_iterations", _iterations, reads=(ITERATIONS,))
