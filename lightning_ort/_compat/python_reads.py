"""Python values a traced forward read, which the ONNX graph holds as constants.

The export runs ``forward`` once under the TorchScript tracer: a number read from a module
(``self.global_step``, a temperature set by a callback, ``nn.Dropout``'s ``p`` changed by a
schedule) or a plain tensor attribute (not a parameter or buffer) becomes a constant of ORT's graph,
as does a number read through one: ``self.hparams.temperature``, ``self.trainer.global_step``, a
config held as a dict, list or namespace (``self.cfg.scale``), and a module-level number a forward
method names.
If the value changes later, eager PyTorch computes with the new one and ORT's graph with the old
one, silently. :func:`recorded_reads` records what the trace read, and :func:`changed_read` tells,
before each call, whether one of those values has changed since.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import types
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from lightning_ort._compat import trace_checks

_NUMBERS = (bool, int, float)
# Set by Lightning and lightning_ort, or kept in sync with the graph by other means (train/eval modes).
_IGNORED = frozenset({"training"})
# Plain containers a forward reads numbers through (a config): their numbers are compared as a whole.
_CONTAINERS = (dict, list, types.SimpleNamespace, argparse.Namespace)
_NUMBER_FIX = "pass the value to forward as a tensor, or register it as a buffer"
_MAX_ITEMS = 1024  # larger ones (a vocabulary) hold no schedule, and comparing them would cost every call


@dataclass
class PythonReads:
    """Module attributes a traced forward read: numbers by value, plain tensors by identity and version;
    numbers read through a module's ``hparams`` or ``trainer`` (``items``, by module, attribute and key) or
    held by a plain container attribute (``containers``: all its numbers)."""

    modules: dict[int, tuple[torch.nn.Module, str]] = field(default_factory=dict)
    numbers: dict[tuple[int, str], list[Any]] = field(default_factory=dict)
    tensors: dict[tuple[int, str], list[tuple[int, int]]] = field(default_factory=dict)
    items: dict[tuple[int, str, str], list[Any]] = field(default_factory=dict)
    containers: dict[tuple[int, str], list[tuple[Any, Any]]] = field(default_factory=dict)
    # id of an hparams or trainer object read during the trace -> the module and attribute it was read from
    watched: dict[int, tuple[int, str]] = field(default_factory=dict)
    # module-level numbers the user's forward methods name: (the Python module's name, the global's) -> value
    globals: dict[tuple[str, str], Any] = field(default_factory=dict)


_READS: weakref.WeakKeyDictionary[torch.nn.Module, PythonReads] = weakref.WeakKeyDictionary()


def reads_of(module: torch.nn.Module) -> PythonReads:
    """What the exports of ``module`` (the module ORT wraps) read, accumulated over its exports."""
    return _READS.setdefault(module, PythonReads())


@contextlib.contextmanager
def recorded_reads(reads: PythonReads, modules: dict[int, tuple[torch.nn.Module, str]]) -> Iterator[None]:
    """Record into ``reads`` the attributes of ``modules`` (id -> module and its name) that code read
    while tracing inside the block."""
    from lightning.fabric.utilities.data import AttributeDict
    from lightning.pytorch import Trainer

    reads.modules.update(modules)
    for module, _ in modules.values():
        reads.globals.update(_global_numbers(type(module)))
    original = torch.nn.Module.__getattribute__

    def __getattribute__(self: torch.nn.Module, name: str) -> Any:
        value = original(self, name)
        if name in _IGNORED or not torch.jit.is_tracing() or id(self) not in modules:
            return value
        if isinstance(value, _NUMBERS):
            _add(reads.numbers.setdefault((id(self), name), []), value)
        elif (
            type(value) is torch.Tensor
            and name in original(self, "__dict__")
            and name not in trace_checks.hooked_weight_names(self)
        ):
            _add(reads.tensors.setdefault((id(self), name), []), (id(value), value._version))
        elif isinstance(value, (AttributeDict, Trainer)):
            # the name the user reads it by (hparams, trainer) over the one its property reads (_hparams)
            if reads.watched.get(id(value), ("", "_"))[1].startswith("_"):
                reads.watched[id(value)] = (id(self), name)
        elif isinstance(value, _CONTAINERS) and name not in _internal_names() and _size(value) <= _MAX_ITEMS:
            reads.containers.setdefault((id(self), name), _numbers_in(value))
        return value

    def record_item(container: Any, key: Any, value: Any) -> None:
        where = reads.watched.get(id(container))
        if where is not None and isinstance(value, _NUMBERS) and isinstance(key, str) and torch.jit.is_tracing():
            _add(reads.items.setdefault((*where, key), []), value)

    def recording(cls: type, name: str) -> Any:
        """``cls.name`` (a lookup: ``__getattr__``, ``__getitem__``, ``__getattribute__``), recording numbers."""
        lookup = getattr(cls, name)

        def read(self: Any, key: Any) -> Any:
            value = lookup(self, key)
            record_item(self, key, value)
            return value

        return read

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(torch.nn.Module, "__getattribute__", __getattribute__))
        for cls, name in (
            (AttributeDict, "__getattr__"),
            (AttributeDict, "__getitem__"),
            (Trainer, "__getattribute__"),
        ):
            stack.enter_context(_patched(cls, name, recording(cls, name)))
        yield


@contextlib.contextmanager
def _patched(cls: type, name: str, function: Any) -> Iterator[None]:
    """``cls.name`` is ``function`` within the block; then what the class itself had (or nothing, so its
    base's is found again)."""
    own = cls.__dict__.get(name)
    setattr(cls, name, function)
    try:
        yield
    finally:
        if own is None:
            delattr(cls, name)
        else:
            setattr(cls, name, own)


def _global_numbers(cls: type) -> dict[tuple[str, str], Any]:
    """The module-level numbers ``cls.forward`` names (``x / TEMPERATURE``), for a class outside torch and
    Lightning: the trace holds them as constants too."""
    forward = getattr(cls, "forward", None)
    namespace = getattr(forward, "__globals__", None)
    code = getattr(forward, "__code__", None)
    if namespace is None or code is None or str(namespace.get("__name__")).startswith(("torch.", "lightning.")):
        return {}
    names: set[str] = set()
    codes = [code]
    while codes:
        current = codes.pop()
        names.update(current.co_names)
        codes.extend(constant for constant in current.co_consts if isinstance(constant, types.CodeType))
    module_name = namespace.get("__name__", "")
    return {(module_name, name): namespace[name] for name in names if isinstance(namespace.get(name), _NUMBERS)}


def _global(module_name: str, name: str) -> Any:
    module = sys.modules.get(module_name)
    return None if module is None else vars(module).get(name)


def _add(values: list[Any], value: Any) -> None:
    if value not in values:
        values.append(value)


@functools.cache
def _internal_names() -> frozenset[str]:
    """Attributes torch and Lightning keep on every module (``__dict__``, ``_modules``, hooks): not configs."""
    from lightning.pytorch import LightningModule

    return frozenset({"__dict__", *vars(torch.nn.Module()), *vars(LightningModule())})


def _size(container: Any) -> int:
    return len(container if isinstance(container, (dict, list)) else vars(container))


def _numbers_in(container: Any) -> list[tuple[Any, Any]]:
    """The numbers a plain container holds directly, with their keys (indices, names)."""
    if isinstance(container, Mapping):
        items: Any = container.items()
    elif isinstance(container, list):
        items = enumerate(container)
    elif isinstance(container, (types.SimpleNamespace, argparse.Namespace)):
        items = vars(container).items()
    else:
        return []
    return [(key, value) for key, value in items if isinstance(value, _NUMBERS)]


def _item(container: Any, key: str) -> Any:
    return container.get(key) if isinstance(container, Mapping) else getattr(container, key, None)


def changed_read(module: torch.nn.Module) -> str | None:
    """Why ``module``'s graphs no longer compute what its forward would (an attribute their export
    read has another value now), or None."""
    reads = _READS.get(module)
    if reads is None:
        return None
    for (key, name), values in reads.numbers.items():
        module, path = reads.modules[key]
        current = getattr(module, name, None)
        if not _is_each(current, values):
            fix = _NUMBER_FIX
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and name == "momentum":
                fix = "none needed when a callback changed it (StochasticWeightAveraging's BatchNorm update does)"
            return _changed_number(f"{path}.{name}", values[0], current, fix)
    for (module_name, name), value in reads.globals.items():
        current = _global(module_name, name)
        if not _is_each(current, [value]):
            return _changed_number(f"the global {module_name}.{name}", value, current)
    for (key, name, item), values in reads.items.items():
        module, path = reads.modules[key]
        current = _item(getattr(module, name, None), item)
        if not _is_each(current, values):
            return _changed_number(f"{path}.{name}.{item}", values[0], current)
    for (key, name), numbers in reads.containers.items():
        module, path = reads.modules[key]
        if _numbers_in(getattr(module, name, None)) != numbers:
            return (
                f"its forward reads {path}.{name}, whose numbers changed after ORT exported the graph "
                f"(they were {dict(numbers)!r}); the graph holds the numbers it read as constants. Fix: pass such "
                "values to forward as tensors, or register them as buffers"
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


def _changed_number(what: str, was: Any, now: Any, fix: str = _NUMBER_FIX) -> str:
    return (
        f"its forward reads {what}, which was {was!r} when ORT exported the graph and is {now!r} now; the graph "
        f"holds the old value as a constant. Fix: {fix}"
    )


def _holds(module: torch.nn.Module, name: str, values: list[Any]) -> bool:
    return _is_each(getattr(module, name, None), values)


def _is_each(current: Any, values: list[Any]) -> bool:
    return isinstance(current, _NUMBERS) and all(current == value and type(current) is type(value) for value in values)


def to_record(reads: PythonReads) -> dict[str, list[Any]]:
    """``reads`` by module name, in JSON's types, to be kept with a cached export (trace_record.py)."""
    return {
        "numbers": [[reads.modules[key][1], name, values] for (key, name), values in reads.numbers.items()],
        "tensors": [[reads.modules[key][1], name] for key, name in reads.tensors],
        "items": [[reads.modules[key][1], name, item, values] for (key, name, item), values in reads.items.items()],
        "containers": [
            [reads.modules[key][1], name, [list(pair) for pair in numbers]]
            for (key, name), numbers in reads.containers.items()
        ],
        "globals": [[module_name, name, value] for (module_name, name), value in reads.globals.items()],
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
    items: dict[tuple[int, str, str], list[Any]] = {}
    for path, name, item, values in record.get("items", []):
        owner = next(
            (module for module in by_name.get(path, []) if _holds_item(getattr(module, name, None), item, values)), None
        )
        if owner is None:
            return f"{path}.{name}.{item} is not {values[0]!r} as when the cached graph was exported"
        items[(id(owner), name, item)] = values
    containers: dict[tuple[int, str], list[tuple[Any, Any]]] = {}
    for path, name, pairs in record.get("containers", []):
        expected = [tuple(pair) for pair in pairs]
        owner = next(
            (module for module in by_name.get(path, []) if _numbers_in(getattr(module, name, None)) == expected), None
        )
        if owner is None:
            return f"the numbers in {path}.{name} are not as when the cached graph was exported"
        containers[(id(owner), name)] = expected
    for module_name, name, value in record.get("globals", []):
        if not _is_each(_global(module_name, name), [value]):
            return f"the global {module_name}.{name} is not {value!r} as when the cached graph was exported"
    tensors: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for path, name in record["tensors"]:
        owner = next((module for module in by_name.get(path, []) if name in vars(module)), None)
        if owner is None or type(vars(owner)[name]) is not torch.Tensor:
            return f"{path}.{name} is not the plain tensor attribute the cached graph read"
        tensor = vars(owner)[name]
        tensors[(id(owner), name)] = [(id(tensor), tensor._version)]
    reads.modules.update(modules)
    reads.numbers.update(numbers)
    reads.items.update(items)
    reads.containers.update(containers)
    reads.globals.update({(module_name, name): value for module_name, name, value in record.get("globals", [])})
    reads.tensors.update(tensors)
    return None


def _holds_item(container: Any, item: str, values: list[Any]) -> bool:
    return _is_each(_item(container, item), values)
