"""Checks on where the traced forward turns gradients off: ORT's graph computes gradients through every
operator unless ``torch.no_grad()`` covers only what needs none (``grad_regions.py``)."""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch

from lightning_ort.engine.export.checks.export_check import ExportCheck, ExportContext, Recorder
from lightning_ort.engine.export.checks.forward_side_effects import INPUT_COPIES
from lightning_ort.engine.export.checks.traced_call_checks import TRACED_CALLS
from lightning_ort.engine.export.grad_regions import GradRegions
from lightning_ort.engine.export.traced_calls import graph_inputs_of, traced_calls
from lightning_ort.engine.export.user_code import user_frame

_GRAD_MODE_FILE = torch.autograd.grad_mode.__file__
_TRACED_CALLS_FILE = sys.modules[traced_calls.__module__].__file__


@contextlib.contextmanager
def _record_grad_disabling(regions: GradRegions) -> Iterator[GradRegions]:
    """Where the traced forward turns gradients off: ``torch.no_grad()`` regions are told to ``regions`` as
    they open and close; any other way (``set_grad_enabled(False)``, ``inference_mode``) is unsafe at once."""
    original = torch._C._set_grad_enabled
    enter, leave = torch.no_grad.__enter__, torch.no_grad.__exit__

    def _set_grad_enabled(mode: bool) -> None:
        caller = sys._getframe(1)
        # past the torch function mode watching this call, which calls this function once more
        while caller.f_code.co_filename in (_TRACED_CALLS_FILE, __file__):
            caller = caller.f_back
        # the export traces with gradients off: leaving a `with torch.enable_grad():` turns them off again
        restoring = caller.f_code.co_name == "__exit__" and caller.f_code.co_filename == _GRAD_MODE_FILE
        if not mode and not restoring and torch.jit.is_tracing() and not _in_no_grad(caller):
            location = user_frame()
            if location is not None and location not in regions.switched:
                regions.switched.append(location)
        original(mode)

    def no_grad_enter(self: torch.no_grad) -> None:
        if torch.jit.is_tracing():
            regions.enter(user_frame())
        enter(self)

    def no_grad_exit(self: torch.no_grad, *args: Any) -> None:
        try:
            leave(self, *args)
        finally:
            if torch.jit.is_tracing():
                regions.leave()

    torch._C._set_grad_enabled = _set_grad_enabled
    torch.no_grad.__enter__ = no_grad_enter  # type: ignore[method-assign]
    torch.no_grad.__exit__ = no_grad_exit  # type: ignore[method-assign]
    try:
        yield regions
    finally:
        torch._C._set_grad_enabled = original
        torch.no_grad.__enter__ = enter  # type: ignore[method-assign]
        torch.no_grad.__exit__ = leave  # type: ignore[method-assign]


def _in_no_grad(frame: types.FrameType | None) -> bool:
    """Whether ``frame`` or one of its callers (a few up) is ``torch.no_grad``'s own ``__enter__``/``__exit__``."""
    for _ in range(4):
        if frame is None:
            return False
        if frame.f_code.co_name in ("__enter__", "__exit__") and isinstance(frame.f_locals.get("self"), torch.no_grad):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def _grad_regions(context: ExportContext) -> Iterator[GradRegions]:
    regions = GradRegions(context.module, context[INPUT_COPIES], graph_inputs_of)
    with _record_grad_disabling(regions) as recorded:
        context[TRACED_CALLS].grad_regions = recorded  # the traced calls tell it what each call computes from
        yield recorded


GRAD_REGIONS = Recorder("grad_regions", _grad_regions)


def _switched_off(context: ExportContext) -> str | None:
    switched = context[GRAD_REGIONS].switched
    if not switched:
        return None
    return (
        f"its forward turns gradients off with set_grad_enabled(False) or inference_mode at "
        f"{switched[0]}; the export cannot tell which computations that covers, and ORT's graph "
        "would compute gradients through them. Fix: use a `with torch.no_grad():` block (ORT follows one that "
        "computes from buffers and inputs that need no gradient), or .detach() the result, which ORT respects"
    )


def _unsafe_no_grad(context: ExportContext) -> str | None:
    unsafe = context[GRAD_REGIONS].unsafe
    if not unsafe:
        return None
    return (
        f"its forward turns gradients off (torch.no_grad() at "
        f"{unsafe[0]}) around a computation from parameters or inputs that need gradients; ORT's "
        "graph would compute gradients through that region. Fix: compute it outside forward, or use .detach() "
        "on its result, which ORT respects"
    )


GRAD_SWITCHED_OFF = ExportCheck("grad_switched_off", _switched_off, reads=(GRAD_REGIONS,))
NO_GRAD_REGIONS = ExportCheck("no_grad_regions", _unsafe_no_grad, reads=(GRAD_REGIONS,))
