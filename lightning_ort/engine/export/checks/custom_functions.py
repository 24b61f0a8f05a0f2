"""Checks on the custom ``torch.autograd.Function``s the traced forward applies: ORT must run each as a
PythonOp node with its own backward, or it would differentiate the Function's forward and ignore that
backward; and torch.utils.checkpoint's reentrant variant, which ORT cannot export."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.checkpoint

from lightning_ort.engine.bootstrap import custom_function
from lightning_ort.engine.export.checks.export_check import ExportCheck, ExportContext, Recorder
from lightning_ort.errors import ORTSetupError


@contextlib.contextmanager
def record_autograd_functions() -> Iterator[list[type]]:
    """Record every custom ``torch.autograd.Function`` applied inside the block, outside other Functions.

    A Function applied inside another Function's ``forward`` runs within that one (whose backward is
    what counts), so only the outermost applications are recorded.
    """
    seen: list[type] = []
    depth = 0
    function_cls = torch.autograd.Function
    # A Python classmethod on torch 2.13, _C._FunctionBase's C classmethod (no __func__) on 2.14 and
    # newer; both bind to a subclass through __get__.
    original = function_cls.__dict__["apply"]

    @functools.wraps(getattr(original, "__func__", original))
    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        nonlocal depth
        # ORT applies identity Functions of its own while exporting; those export correctly.
        if depth == 0 and cls not in seen and not cls.__module__.startswith("onnxruntime."):
            seen.append(cls)
        depth += 1
        try:
            return original.__get__(None, cls)(*args, **kwargs)
        finally:
            depth -= 1

    function_cls.apply = classmethod(apply)  # type: ignore[method-assign,assignment]
    try:
        yield seen
    finally:
        function_cls.apply = original  # type: ignore[method-assign]


AUTOGRAD_FUNCTIONS = Recorder("autograd_functions", lambda context: record_autograd_functions())

# ORT cannot export torch.utils.checkpoint's reentrant variant (a Function that recomputes its own
# PyTorch graph in backward); the non-reentrant one exports as the plain computation.
_REENTRANT_CHECKPOINT = (
    "it uses torch.utils.checkpoint with use_reentrant=True (torch.utils.checkpoint.CheckpointFunction), which "
    "ORT cannot export. Fix: use_reentrant=False (ORT then trains the checkpointed computation as part of its "
    "graph, without recomputation)"
)


def _reentrant_checkpoint(context: ExportContext, error: BaseException) -> str | None:
    # ORT's own message blames export in general; fallback reports show the root cause only.
    return _REENTRANT_CHECKPOINT if torch.utils.checkpoint.CheckpointFunction in context[AUTOGRAD_FUNCTIONS] else None


def _functions_problem(context: ExportContext) -> str | None:
    """Why the Functions the module applies would not train as in PyTorch under ORT, if they would not."""
    functions: list[type] = context[AUTOGRAD_FUNCTIONS]
    record = context.exported
    if not functions:
        return None
    names = ", ".join(f"{cls.__module__}.{cls.__qualname__}" for cls in functions)
    if not record.keeps_functions:
        return (
            f"it applies custom torch.autograd.Function(s) {names}; ORT would differentiate their forward "
            f"and ignore their custom backward ({custom_function.support_off_reason()})"
        )
    if record.python_ops:
        try:
            custom_function.ensure_runner()  # compiled now, the first time a graph runs a custom Function
        except ORTSetupError:
            return f"it applies custom torch.autograd.Function(s) {names} ({custom_function.support_off_reason()})"
    clashes = custom_function.check_registered(
        [cls for cls in functions if custom_function.qualified_name(cls) in record.python_ops]
    )
    # An ONNX `symbolic` (or one of ORT's special exporters) replaces the Function by ONNX operators,
    # which ORT differentiates itself: the custom backward would be ignored.
    inlined = [cls for cls in functions if custom_function.qualified_name(cls) not in record.python_ops]
    if inlined:
        names = ", ".join(f"{cls.__module__}.{cls.__qualname__}" for cls in inlined)
        return (
            f"custom torch.autograd.Function(s) {names} were exported as ONNX operators (e.g. through a "
            "`symbolic` method) instead of PythonOp nodes; ORT would differentiate those operators and ignore "
            "the custom backward"
        )
    if clashes:
        names = ", ".join(f"{cls.__module__}.{cls.__qualname__}" for cls in clashes)
        return (
            f"custom torch.autograd.Function(s) {names} have the qualified name of another Function class that "
            "ORT already runs in this process (a redefined class?); ORT would run the other class"
        )
    return None


REENTRANT_CHECKPOINT = ExportCheck("reentrant_checkpoint", failure=_reentrant_checkpoint, reads=(AUTOGRAD_FUNCTIONS,))
CUSTOM_FUNCTIONS = ExportCheck("custom_functions", _functions_problem, reads=(AUTOGRAD_FUNCTIONS,))
