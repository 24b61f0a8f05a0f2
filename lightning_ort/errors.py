"""Exceptions raised by lightning_ort."""

from __future__ import annotations


class ORTSetupError(RuntimeError):
    """ONNX Runtime training cannot be set up here (wrong flavour, missing compiler, unwritable cache...)."""


class ORTFallbackError(RuntimeError):
    """ORT could not run a module and ``fallback="raise"`` was requested."""


class ORTUnsupportedModelError(RuntimeError):
    """A module that ORT would export or differentiate incorrectly, so it must not run in ORT."""


class ORTExportTimeoutError(TimeoutError):
    """Exporting and building a module's ORT graph took longer than ``ORTStrategy(export_timeout=...)``."""


class ORTParityError(RuntimeError):
    """ORT's loss or gradients differ from eager PyTorch's beyond the tolerance of ``ORTParityCheck``."""


class ONNXExportError(RuntimeError):
    """``ONNXExport`` could not write an ONNX model that runs like the trained PyTorch model."""
