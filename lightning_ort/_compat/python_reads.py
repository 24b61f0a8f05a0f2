"""Python values a traced forward read, which the ONNX graph holds as constants.

The export runs ``forward`` once under the TorchScript tracer: a number read from a module
(``self.global_step``, a temperature set by a callback, ``nn.Dropout``'s ``p`` changed by a
schedule) or a plain tensor attribute (not a parameter or buffer) becomes a constant of ORT's graph.
If the value changes later, eager PyTorch computes with the new one and ORT's graph with the old
one, silently. :func:`recorded_reads` records what the trace read, and :func:`changed_read` tells,
before each call, whether one of those values has changed since.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

_NUMBERS = (bool, int, float)
# Set by Lightning and lightning_ort, or kept in sync with the graph by other means (train/eval modes).
_IGNORED = frozenset({"training"})


@dataclass
class PythonReads:
    """Module attributes a traced forward read: numbers by value, plain tensors by identity and version."""

    modules: dict[int, tuple[torch.nn.Module, str]] = field(default_factory=dict)
    numbers: dict[tuple[int, str], list[Any]] = field(default_factory=dict)
    tensors: dict[tuple[int, str], list[tuple[int, int]]] = field(default_factory=dict)


_READS: weakref.WeakKeyDictionary[torch.nn.Module, PythonReads] = weakref.WeakKeyDictionary()


def reads_of(module: torch.nn.Module) -> PythonReads:
    """What the exports of ``module`` (the module ORT wraps) read, accumulated over its exports."""
    return _READS.setdefault(module, PythonReads())


@contextlib.contextmanager
def recorded_reads(reads: PythonReads, modules: dict[int, tuple[torch.nn.Module, str]]) -> Iterator[None]:
    """Record into ``reads`` the attributes of ``modules`` (id -> module and its name) that code read
    while tracing inside the block."""
    reads.modules.update(modules)
    original = torch.nn.Module.__getattribute__

    def __getattribute__(self: torch.nn.Module, name: str) -> Any:
        value = original(self, name)
        if name in _IGNORED or not torch.jit.is_tracing() or id(self) not in modules:
            return value
        if isinstance(value, _NUMBERS):
            values = reads.numbers.setdefault((id(self), name), [])
            if value not in values:
                values.append(value)
        elif type(value) is torch.Tensor and name in original(self, "__dict__"):
            tensors = reads.tensors.setdefault((id(self), name), [])
            if (id(value), value._version) not in tensors:
                tensors.append((id(value), value._version))
        return value

    own = torch.nn.Module.__dict__.get("__getattribute__")
    torch.nn.Module.__getattribute__ = __getattribute__  # type: ignore[method-assign]
    try:
        yield
    finally:
        if own is None:
            del torch.nn.Module.__getattribute__
        else:
            torch.nn.Module.__getattribute__ = own  # type: ignore[method-assign]


def changed_read(module: torch.nn.Module) -> str | None:
    """Why ``module``'s graphs no longer compute what its forward would (an attribute their export
    read has another value now), or None."""
    reads = _READS.get(module)
    if reads is None:
        return None
    for (key, name), values in reads.numbers.items():
        module, path = reads.modules[key]
        current = getattr(module, name, None)
        if any(current != value or type(current) is not type(value) for value in values):
            return (
                f"its forward reads {path}.{name}, which was {values[0]!r} when ORT exported the graph and is "
                f"{current!r} now; the graph holds the old value as a constant. Fix: pass the value to forward "
                "as a tensor, or register it as a buffer"
            )
    for (key, name), tensors in reads.tensors.items():
        module, path = reads.modules[key]
        current = getattr(module, name, None)
        state = (id(current), current._version) if isinstance(current, torch.Tensor) else None
        if any(state != tensor for tensor in tensors):
            return (
                f"its forward reads the plain tensor attribute {path}.{name}, which changed after ORT exported "
                "the graph; the graph holds its old value as a constant. Fix: register it as a buffer "
                "(self.register_buffer), which ORT reads on every call"
            )
    return None


def _holds(module: torch.nn.Module, name: str, values: list[Any]) -> bool:
    current = getattr(module, name, None)
    return isinstance(current, _NUMBERS) and all(current == value and type(current) is type(value) for value in values)


def to_record(reads: PythonReads) -> dict[str, list[Any]]:
    """``reads`` by module name, in JSON's types, to be kept with a cached export (trace_record.py)."""
    return {
        "numbers": [[reads.modules[key][1], name, values] for (key, name), values in reads.numbers.items()],
        "tensors": [[reads.modules[key][1], name] for key, name in reads.tensors],
    }


def from_record(
    reads: PythonReads, modules: dict[int, tuple[torch.nn.Module, str]], record: dict[str, list[Any]]
) -> str | None:
    """Add to ``reads`` those a cached export's trace made (``to_record``), plain tensors as they are
    now; or, changing nothing, say why the cached graph does not fit (a value it holds differs)."""
    by_name: dict[str, list[torch.nn.Module]] = {}
    for module, name in modules.values():
        by_name.setdefault(name, []).append(module)
    numbers: dict[tuple[int, str], list[Any]] = {}
    for path, name, values in record["numbers"]:
        owner = next((module for module in by_name.get(path, []) if _holds(module, name, values)), None)
        if owner is None:
            return f"{path}.{name} is not {values[0]!r} as when the cached graph was exported"
        numbers[(id(owner), name)] = values
    tensors: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for path, name in record["tensors"]:
        owner = next((module for module in by_name.get(path, []) if name in vars(module)), None)
        if owner is None or type(vars(owner)[name]) is not torch.Tensor:
            return f"{path}.{name} is not the plain tensor attribute the cached graph read"
        tensor = vars(owner)[name]
        tensors[(id(owner), name)] = [(id(tensor), tensor._version)]
    reads.modules.update(modules)
    reads.numbers.update(numbers)
    reads.tensors.update(tensors)
    return None
