"""Checks on the torch calls of the traced forward (recorded by ``traced_calls.py``): calls ORT cannot train,
tensors given as kernel or output sizes, and splits used only for their number of parts."""

from __future__ import annotations

from lightning_ort.engine.export.checks.export_check import ExportCheck, ExportContext, Recorder
from lightning_ort.engine.export.checks.tracer_warnings import WARNINGS
from lightning_ort.engine.export.traced_calls import traced_calls
from lightning_ort.engine.export.user_code import user_frame

TRACED_CALLS = Recorder("traced_calls", lambda context: traced_calls(context.module, user_frame, context[WARNINGS]))


def _unsupported(context: ExportContext) -> str | None:
    unsupported = context[TRACED_CALLS].unsupported
    return unsupported[0] if unsupported else None


def _size_tensors(context: ExportContext) -> str | None:
    size_tensors = context[TRACED_CALLS].size_tensors
    if not size_tensors:
        return None
    return (
        f"its forward gives a tensor (under ONNX export, also a size such as x.shape[2]) as a kernel or output "
        f"size at {size_tensors[0]} (F.max_pool1d(x, x.shape[2])); the export freezes that number, so later "
        "batches of another length would pool over the first batch's size. Fix: reduce over the dimension "
        "(x.amax(dim=2), x.mean(dim=2)) or use a fixed size, or keep that module out of ORT with "
        "ORTStrategy(modules=[...])"
    )


def _counted_splits(context: ExportContext) -> str | None:
    counted_splits = context[TRACED_CALLS].counted_splits
    if not counted_splits:
        return None
    return (
        f"its forward splits a tensor at {counted_splits[0]} (len(x.unbind(1)), enumerate(x.split(1, 1))) "
        "along a dimension that can change size between batches and uses only the number of parts; the export "
        "freezes that number at the first batch's size. Fix: use the size itself in tensor arithmetic "
        "(h.sum(1) / h.shape[1], h.mean(1)), or keep that module out of ORT with ORTStrategy(modules=[...])"
    )


# ORT's export of a call it cannot train fails too, with a message that says less than this one
UNSUPPORTED_CALLS = ExportCheck(
    "unsupported_calls", _unsupported, failure=lambda context, error: _unsupported(context), reads=(TRACED_CALLS,)
)
SIZE_TENSORS = ExportCheck("size_tensors", _size_tensors, reads=(TRACED_CALLS,))
COUNTED_SPLITS = ExportCheck("counted_splits", _counted_splits, reads=(TRACED_CALLS,))
