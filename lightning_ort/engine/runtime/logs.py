"""ORT's log levels and where its messages go.

ORTModule logs twice: its Python frontend through the ``orttraining`` logger, and its C++ runtime
(graph optimizers, sessions, kernels) straight to the process's stderr in the form
``<date> <time> [W:onnxruntime:<logger>, <file>:<line> <function>] <message>``. lightning_ort
forwards the first to a Python logger of its own and parses the second out of a temporarily
redirected stderr, so both obey the user's ``logging`` configuration.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable
from typing import IO, Literal

import torch

from lightning_ort.engine.runtime import settings
from lightning_ort.engine.runtime.ortmodule import _execution_managers

LogLevelName = Literal["VERBOSE", "INFO", "WARNING", "ERROR", "FATAL"]
LOG_LEVELS: tuple[LogLevelName, ...] = ("VERBOSE", "INFO", "WARNING", "ERROR", "FATAL")

ORT_PYTHON_LOGGER = "orttraining"
# Where lightning_ort logs what ORT writes: its Python frontend's records and its native runtime's lines.
PYTHON_LOGGER = "lightning_ort.ort"
NATIVE_LOGGER = "lightning_ort.ort.native"

_PYTHON_LEVELS = {
    "VERBOSE": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
}
# ORT's own mapping (ORTMODULE_LOG_LEVEL_MAP): its INFO already floods stderr, so INFO keeps native warnings.
_NATIVE_SEVERITIES = {"VERBOSE": 0, "INFO": 2, "WARNING": 2, "ERROR": 3, "FATAL": 4}
_SEVERITY_LEVELS = {
    "V": logging.DEBUG,
    "I": logging.INFO,
    "W": logging.WARNING,
    "E": logging.ERROR,
    "F": logging.CRITICAL,
}
_NATIVE_LINE = re.compile(
    r"^\S+ \S+ \[(?P<severity>[VIWEF]):onnxruntime:[^,\]]*,? ?(?P<where>[^\]]*)\] ?(?P<message>.*)$"
)
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_ORT_REPLAY = re.compile(r"^\[[\w ]+\] (Filtered|Full) logs")


def python_level(level: LogLevelName) -> int:
    """The Python ``logging`` level that corresponds to an ORT level name."""
    return _PYTHON_LEVELS[level]


def set_log_level(ort_module: torch.nn.Module, level: LogLevelName) -> None:
    """Set the verbosity of ``ort_module``: its Python logger, graph builder and native sessions.

    Sessions that already exist keep the severity they were created with; the native lines they
    write below ``level`` are dropped by :class:`NativeLogCapture`.
    """
    from onnxruntime.training.ortmodule._logger import LogLevel

    ort_level = LogLevel[level]
    for manager in _execution_managers(ort_module):
        options = manager._debug_options  # shared by the module's managers and graph transition managers
        options.log_level = ort_level
        options._logging._log_level = ort_level  # read when graphs and sessions are (re)built
        # ORT would set int(LogLevel), one level off its own table (LogLevel.WARNING is severity ERROR)
        settings.update(manager, log_severity=_NATIVE_SEVERITIES[level])
    logging.getLogger(ORT_PYTHON_LOGGER).setLevel(python_level(level))


def set_python_log_level(level: LogLevelName) -> None:
    """Set the level of ORT's Python logger (shared by every ORTModule of the process)."""
    logging.getLogger(ORT_PYTHON_LOGGER).setLevel(python_level(level))


class PythonLogRoute(logging.Handler):
    """While open, records of ORT's ``orttraining`` logger go to ``target`` instead of the root logger.

    While torch exports a module, ORT redirects stderr into a file and then replays what it caught
    as one WARNING record (``[export] Filtered logs ...``). Records handled inside that window
    would be written into the replay, so they are held back while ``stderr_elsewhere()`` is true
    and handled just before the next record (or :meth:`hand_on_held`).

    Attributes:
        replay_level: the level for ORT's replays, or ``None`` for ORT's WARNING. At verbosities
            below WARNING the replay is mostly torch's verbose export printout.
    """

    def __init__(self, target: logging.Logger, stderr_elsewhere: Callable[[], bool] = lambda: False) -> None:
        super().__init__()
        self.target = target
        self.replay_level: int | None = None
        self._stderr_elsewhere = stderr_elsewhere
        self._held: list[logging.LogRecord] = []
        self._source = logging.getLogger(ORT_PYTHON_LOGGER)
        self._saved_propagate = self._source.propagate
        self._source.addHandler(self)
        self._source.propagate = False

    def emit(self, record: logging.LogRecord) -> None:
        message = _ANSI_ESCAPE.sub("", record.getMessage())
        level = record.levelno
        if self.replay_level is not None and _ORT_REPLAY.match(message):
            level = self.replay_level
        if not self.target.isEnabledFor(level):
            return
        clone = logging.makeLogRecord(record.__dict__)
        clone.name = self.target.name
        clone.msg, clone.args = message, None
        clone.levelno, clone.levelname = level, logging.getLevelName(level)
        if self._stderr_elsewhere():
            self._held.append(clone)
            return
        self.hand_on_held()
        self.target.handle(clone)

    def hand_on_held(self) -> None:
        """Handle the records held back."""
        held, self._held = self._held, []
        for record in held:
            self.target.handle(record)

    def close(self) -> None:
        """Hand on held records and give ORT's logger back its own propagation."""
        self.hand_on_held()
        if self in self._source.handlers:
            self._source.removeHandler(self)
            self._source.propagate = self._saved_propagate
        super().close()


# ORT's own default for its process-wide logger
_DEFAULT_LOGGER_SEVERITY = _NATIVE_SEVERITIES["WARNING"]


def _quiet_default_logger() -> None:
    """Put ORT's process-wide default logger back to WARNING.

    Creating a session with a verbose severity lowers it for the whole process, and ORT's
    intra-op threads log through it when they start (``pthread_setaffinity_np succeed ...``),
    possibly after the capture has ended and in sessions created later: such lines went straight
    to stderr."""
    from onnxruntime.capi import _pybind_state

    _pybind_state.set_default_logger_severity(_DEFAULT_LOGGER_SEVERITY)


class NativeLogCapture:
    """Captures the process's stderr (file descriptor 2) between :meth:`start` and :meth:`stop`.

    On stop, ORT's native log lines at or above ``min_level`` are logged to ``target`` (the others
    are dropped); every other line is written back to stderr unchanged, in order.
    """

    def __init__(self, target: logging.Logger) -> None:
        self.target = target
        self._file: IO[bytes] | None = None
        self._saved_fd: int | None = None
        self._min_level = logging.WARNING

    @property
    def active(self) -> bool:
        """Whether stderr is being captured now."""
        return self._saved_fd is not None

    def stderr_elsewhere(self) -> bool:
        """Whether, while capturing, stderr was redirected again by someone else (ORT does during export)."""
        if self._saved_fd is None or self._file is None:
            return False
        ours, now = os.fstat(self._file.fileno()), os.fstat(2)
        return (ours.st_dev, ours.st_ino) != (now.st_dev, now.st_ino)

    def start(self, min_level: int) -> None:
        """Start capturing (no-op when already capturing)."""
        if self.active:
            return
        self._min_level = min_level
        sys.stderr.flush()
        if self._file is None:
            self._file = tempfile.TemporaryFile()
        self._file.seek(0)
        self._file.truncate()
        self._saved_fd = os.dup(2)
        os.dup2(self._file.fileno(), 2)

    def stop(self) -> None:
        """Restore stderr and hand on what was captured (no-op when not capturing)."""
        if self._saved_fd is None or self._file is None:
            return
        _quiet_default_logger()
        sys.stderr.flush()
        os.dup2(self._saved_fd, 2)
        os.close(self._saved_fd)
        self._saved_fd = None
        self._file.seek(0)
        captured = self._file.read()
        if captured:
            self._dispatch(captured)

    def close(self) -> None:
        """Stop and release the temporary file."""
        self.stop()
        if self._file is not None:
            self._file.close()
            self._file = None

    def _dispatch(self, captured: bytes) -> None:
        passthrough: list[bytes] = []
        for line in captured.splitlines(keepends=True):
            text = _ANSI_ESCAPE.sub("", line.decode("utf-8", errors="replace")).rstrip("\r\n")
            match = _NATIVE_LINE.match(text)
            if match is None:
                passthrough.append(line)
                continue
            level = _SEVERITY_LEVELS[match["severity"]]
            if level >= self._min_level and self.target.isEnabledFor(level):
                if passthrough:  # keep the order of what was written
                    os.write(2, b"".join(passthrough))
                    passthrough = []
                self.target.log(level, "%s: %s", match["where"], match["message"])
        if passthrough:
            os.write(2, b"".join(passthrough))
