"""What an export check is: a :class:`Recorder` entered around ORT's export, an :class:`ExportCheck` that
reads what recorders recorded and says why the module is refused, and the :class:`ExportContext` both share.

A recorder is one object that several checks may read (the traced calls, the warnings, the buffers): the
recorders nest in one order (``export_guard.RECORDERS``), the checks refuse in another
(``export_guard.EXPORT_CHECKS``), and each check names the recorders it reads.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch

from lightning_ort.engine.export.python_state import PythonState
from lightning_ort.engine.export.torchscript_export import ExportRecord


@dataclass(frozen=True, eq=False)
class Recorder:
    """A context manager entered around ORT's export (``enter(context)``); what it yields is what it
    recorded, read by checks as ``context[recorder]``. Recorders entered before it are readable already."""

    name: str
    enter: Callable[[ExportContext], AbstractContextManager[Any]]


@dataclass(frozen=True, eq=False)
class ExportCheck:
    """One reason to refuse a module.

    ``problem(context)``: the refusal's message, or None. A check with ``before_export`` runs before any
    recorder is entered (a pattern of the module itself); the others run after ORT's export succeeded.
    ``failure(context, error)``: the message that replaces ORT's own ``error`` when the export itself
    raised, or None (its recorders are still open then). ``reads``: the recorders it reads.
    """

    name: str
    problem: Callable[[ExportContext], str | None] | None = None
    failure: Callable[[ExportContext, BaseException], str | None] | None = None
    reads: tuple[Recorder, ...] = ()
    before_export: bool = False


@dataclass
class ExportContext:
    """What the checks of one export share: the module ORT exports (its _FlattenedModule), the Python state
    its forward may change, what the TorchScript export did, and each entered recorder's record."""

    module: torch.nn.Module
    state: PythonState
    exported: ExportRecord = field(default_factory=ExportRecord)
    records: dict[Recorder, Any] = field(default_factory=dict)

    def __getitem__(self, recorder: Recorder) -> Any:
        return self.records[recorder]
