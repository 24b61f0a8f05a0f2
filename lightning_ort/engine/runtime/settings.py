"""The settings lightning_ort's hooks into ORT read for one wrapped module, as one typed object.

:func:`lightning_ort.engine.runtime.ortmodule.wrap_module` resolves the user's
:class:`~lightning_ort.engine.runtime.ortmodule.ORTRuntimeOptions` for a module into a
:class:`ModuleSettings` and attaches it to the ORT objects of that module that the hooks see (its flattened
module, its two execution managers, their execution agents). A hook asks :func:`settings_of` for the object
ORT hands it. An ORT object lightning_ort did not create gets :data:`UNCONFIGURED`: no rewrites, no arena,
ORT's own session settings.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class ModuleSettings:
    """What the hooks into ORT do for one wrapped module (resolved: no ``None`` meaning "decide later")."""

    op_rewrites: bool = False  # export with op_rewrites.py's forms (ops on torch's kernels)
    export_cache: bool = False  # reuse an identical module's export from an earlier process
    channels_last: bool = False  # the graph pass holding convolution activations channels-last
    unbind: bool = False  # the graph pass splitting packed q/k/v projections (unbind.py)
    fuse_attention: bool = False  # the graph pass fusing attention written out by hand
    memory_arena: bool = False  # graph runs draw torch kernels' CPU memory from the arena
    session_entries: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    intra_op_num_threads: int | None = None  # None: ORT's choice
    profile_file_prefix: str | None = None  # ORT's per-node profiler on, writing files with this prefix
    log_severity: int | None = None  # the native sessions' log severity; None: ORT's choice


UNCONFIGURED = ModuleSettings()

_ATTACHED: weakref.WeakKeyDictionary[Any, ModuleSettings] = weakref.WeakKeyDictionary()


def attach(settings: ModuleSettings, *ort_objects: Any) -> None:
    """Make :func:`settings_of` return ``settings`` for each of ``ort_objects``."""
    for ort_object in ort_objects:
        _ATTACHED[ort_object] = settings


def settings_of(ort_object: Any) -> ModuleSettings:
    """The settings attached to ``ort_object``; :data:`UNCONFIGURED` for one lightning_ort did not wrap."""
    return _ATTACHED.get(ort_object, UNCONFIGURED)


def update(ort_object: Any, **changes: Any) -> None:
    """Replace fields of the settings attached to ``ort_object`` (for that object only)."""
    _ATTACHED[ort_object] = dataclasses.replace(settings_of(ort_object), **changes)
