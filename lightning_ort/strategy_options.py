"""The checks of the options every ORT strategy takes: each error names the strategy class, the option and the
bad value."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from lightning_ort import engine
from lightning_ort.auto_choice import MODES

LogLevel = Literal[
    "VERBOSE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL", "CRITICAL",
    "verbose", "debug", "info", "warning", "error", "fatal", "critical",
]  # fmt: skip
# ORT's level for each accepted name, in either case: Python's DEBUG and CRITICAL are ORT's lowest and highest.
_LOG_LEVELS: dict[str, engine.LogLevelName] = {
    "VERBOSE": "VERBOSE", "DEBUG": "VERBOSE", "INFO": "INFO", "WARNING": "WARNING",
    "ERROR": "ERROR", "FATAL": "FATAL", "CRITICAL": "FATAL",
}  # fmt: skip
_FALLBACKS = ("warn", "raise")


def check_options(
    name: str,
    *,
    mode: Any,
    log_level: Any,
    fallback: Any,
    modules: Any,
    intra_op_num_threads: Any,
    flags: Mapping[str, Any],
    optional_flags: Mapping[str, Any],
    export_timeout: Any,
) -> engine.LogLevelName:
    """Raise ``ValueError``/``TypeError`` for a bad option of strategy class ``name``; ORT's name of ``log_level``.

    ``flags`` must be bools, ``optional_flags`` bools or ``None``.
    """
    if mode not in MODES:
        raise ValueError(
            f"{name}(mode={mode!r}) must be 'ort' (ORT runs the model) or 'auto' (time ORT against PyTorch "
            "during the first steps and keep the faster)."
        )
    level = _LOG_LEVELS.get(log_level.upper()) if isinstance(log_level, str) else None
    if level is None:
        raise ValueError(
            f"{name}(log_level={log_level!r}) is not one of VERBOSE, INFO, WARNING, ERROR, FATAL or Python's "
            "DEBUG (VERBOSE) and CRITICAL (FATAL), in upper or lower case."
        )
    if fallback not in _FALLBACKS:
        raise ValueError(f"{name}(fallback={fallback!r}) must be 'warn' or 'raise'.")
    if modules is not None and (
        isinstance(modules, str)
        or not isinstance(modules, (list, tuple))
        or not all(isinstance(module, str) and module for module in modules)
    ):
        raise TypeError(f"{name}(modules={modules!r}) must be a list of submodule names, e.g. ['encoder'].")
    if intra_op_num_threads is not None and (
        isinstance(intra_op_num_threads, bool) or not isinstance(intra_op_num_threads, int) or intra_op_num_threads < 1
    ):
        raise ValueError(f"{name}(intra_op_num_threads={intra_op_num_threads!r}) must be a positive int.")
    for option, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name}({option}={value!r}) must be True or False.")
    for option, value in optional_flags.items():
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{name}({option}={value!r}) must be True, False or None.")
    if export_timeout is not None and (
        isinstance(export_timeout, bool) or not isinstance(export_timeout, (int, float)) or export_timeout <= 0
    ):
        raise ValueError(f"{name}(export_timeout={export_timeout!r}) must be a positive number of seconds or None.")
    return level
