"""Hooks on ORT's logging: the feature table at INFO, silencing without file descriptors, no graph dumps."""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import sys
from typing import Any


def feature_table_at_info_level() -> None:
    """ORT logs a large feature table at WARNING after every graph build (training and inference).
    It is information, not a warning: show it at log_level="INFO" and below."""
    from onnxruntime.training.ortmodule._graph_execution_manager import GraphExecutionManager

    original = GraphExecutionManager._log_feature_stats

    @functools.wraps(original)
    def _log_feature_stats(self: Any) -> None:
        logger = self._logger
        logger.warning = logger.info  # instance attribute shadows Logger.warning for this call
        try:
            original(self)
        finally:
            del logger.warning

    GraphExecutionManager._log_feature_stats = _log_feature_stats  # type: ignore[method-assign]


def stream_suppression_without_file_descriptors() -> None:
    """ORT silences the exporter by redirecting the stdout/stderr file descriptors. Where
    ``sys.stdout`` has none (notebooks, IDE consoles, ``redirect_stdout(StringIO())``) that raised and
    the module fell back to PyTorch; there the output is simply not silenced."""
    from onnxruntime.training.ortmodule import _logger

    original = _logger._suppress_os_stream_output

    def _has_descriptors() -> bool:
        try:
            return all(isinstance(stream.fileno(), int) for stream in (sys.stdout, sys.stderr))
        except (AttributeError, OSError, ValueError):
            return False

    @functools.wraps(original)
    def _suppress_os_stream_output(enable: bool = True, on_exit: Any = None) -> Any:
        if enable and not _has_descriptors():
            return contextlib.nullcontext()
        return original(enable=enable, on_exit=on_exit)

    _logger._suppress_os_stream_output = _suppress_os_stream_output


_GRAPH_DUMP = b"Torch IR graph at exception"


def exporter_graph_dump_left_out() -> None:
    """A failed export prints torch's whole TorchScript graph (hundreds of lines), which ORT captures and logs
    as a warning with the rest of the exporter's output; the fallback's reason already names the failure.
    The graph is cut from that log (with ORT's ``log_level`` at INFO or below ORT captures nothing, and
    torch's output is printed whole)."""
    from onnxruntime.training.ortmodule import _logger

    original = _logger._log_with_filter

    @functools.wraps(original)
    def _log_with_filter(logger: logging.Logger, record_filters: Any, name: Any, fo: Any) -> None:
        end = fo.tell()
        fo.seek(0)
        content = fo.read()
        fo.seek(end)
        found = content.find(_GRAPH_DUMP)
        if found >= 0:
            kept = content[: content.rfind(b"\n", 0, found) + 1] + b"(torch's graph at the failure left out)\n"
            fo = io.BytesIO(kept)
            fo.seek(0, io.SEEK_END)
        original(logger, record_filters, name, fo)

    _logger._log_with_filter = _log_with_filter
