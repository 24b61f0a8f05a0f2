"""ORT's export through torch's TorchScript exporter, which ORT 1.19 expects, and what it did with custom
``torch.autograd.Function``s (kept as PythonOp nodes, or inlined)."""

from __future__ import annotations

import contextlib
import functools
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import onnx
import torch
from torch.onnx import TrainingMode


@dataclass
class ExportRecord:
    """What one ORT export did with custom autograd.Functions."""

    # ORT asked the exporter to keep Functions as PythonOp nodes (custom-Function support was on
    # when the ORTModule was created); otherwise their forward is inlined.
    keeps_functions: bool = False
    # Qualified names of the Functions that became PythonOp nodes.
    python_ops: set[str] = field(default_factory=set)
    # torch's exporter ran (no export served from the cache, export_cache.py): a trace happened.
    traced: bool = False


def _python_op_names(exported: Any) -> set[str]:
    if not isinstance(exported, io.BytesIO):
        return set()
    model = onnx.load_model_from_string(exported.getvalue())
    names = set()
    for node in model.graph.node:
        if node.domain == "com.microsoft" and node.op_type == "PythonOp":
            for attribute in node.attribute:
                if attribute.name == "func_name":
                    names.add(attribute.s.decode())
    return names


@contextlib.contextmanager
def torchscript_exporter(record: ExportRecord) -> Iterator[None]:
    """Inside the block ``torch.onnx.export`` uses the TorchScript exporter, which ORT 1.19 expects."""
    original = torch.onnx.export

    @functools.wraps(original)
    def export(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("dynamo", False)
        model = args[0] if args else kwargs.get("model")
        requested = kwargs.get("training")
        # TRAINING/EVAL make the exporter call model.train(mode) recursively, which would trace (and
        # afterwards leave) a frozen eval-mode BatchNorm or Dropout in training mode. When the top
        # module is already in the requested mode, PRESERVE keeps every submodule's own mode.
        if isinstance(model, torch.nn.Module) and requested in (TrainingMode.TRAINING, TrainingMode.EVAL):
            if model.training == (requested == TrainingMode.TRAINING):
                kwargs["training"] = TrainingMode.PRESERVE
        record.traced = True
        record.keeps_functions = kwargs.get("autograd_inlining") is False
        if not record.keeps_functions:
            return original(*args, **kwargs)
        from lightning_ort.engine.bootstrap.custom_function import python_op_symbolic

        training = (
            None if requested not in (TrainingMode.TRAINING, TrainingMode.EVAL) else requested == TrainingMode.TRAINING
        )
        with python_op_symbolic(training):
            result = original(*args, **kwargs)
        record.python_ops = _python_op_names(args[2] if len(args) > 2 else kwargs.get("f"))
        return result

    torch.onnx.export = export  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.onnx.export = original
