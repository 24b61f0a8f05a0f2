"""Python values a traced forward read, which the ONNX graph holds as constants.

The export runs ``forward`` once under the TorchScript tracer: a number read from a module
(``self.global_step``, a temperature set by a callback, ``nn.Dropout``'s ``p`` changed by a
schedule) or a plain tensor attribute (not a parameter or buffer) becomes a constant of ORT's graph,
as does a number read through one: ``self.hparams.temperature``, ``self.trainer.global_step``, a
config held as a dict, list, tuple, namespace, dataclass or other plain object (``self.cfg.scale``,
nested ones too), and a module-level number or container a forward method names. Strings, enums and
``None`` count as such values (``if self.mode == "sharp"``), and so does an attribute missing when
the trace looked for it (``getattr(self, "scale", 1.0)``).
If the value changes later, eager PyTorch computes with the new one and ORT's graph with the old
one, silently. :func:`recorded_reads` records what the trace read, and :func:`changed_read` tells,
before each call, whether one of those values has changed since; the guard then has ORT export
again (after :func:`forget_reads`), or hands the module to PyTorch if the value changes too often.

Over 300 lines because recording a read (:func:`recorded_reads`) and checking it before each call
(:func:`changed_read`, and from a cached export's record) walk the same kinds of values (configs, containers,
module globals) with shared helpers; splitting them would split those helpers.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import functools
import sys
import types
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from lightning_ort.engine.export.guards.module_hooks import hooked_weight_names
from lightning_ort.engine.export.python_state import tensor_version

_NUMBERS = (bool, int, float)
# Values a branch or a constant of the graph can depend on besides numbers (compared by value)
_OTHER_VALUES = (str, type(None), enum.Enum)
# Set by Lightning and lightning_ort, or kept in sync with the graph by other means (train/eval modes).
_IGNORED = frozenset({"training"})
# Plain containers a forward reads values through (a config): their values are compared as a whole.
_CONTAINERS = (dict, list, tuple, types.SimpleNamespace, argparse.Namespace)
# Libraries whose objects a module holds without being its configuration (Lightning's trainer and loggers)
_LIBRARIES = ("torch", "lightning", "onnxruntime", "numpy", "builtins", "jsonargparse", "torchmetrics")
_NUMBER_FIX = "pass the value to forward as a tensor, or register it as a buffer"
_MAX_ITEMS = 1024  # larger ones (a vocabulary) hold no schedule, and comparing them would cost every call
_MAX_DEPTH = 4
# What an attribute missing when the trace looked for it is recorded as
ABSENT = "<absent>"


@dataclass
class PythonReads:
    """Module attributes a traced forward read: plain values by value (:func:`plain`), plain tensors by
    identity and version; numbers read through a module's ``hparams`` or ``trainer`` (``items``, by module,
    attribute and key) or held by a plain container attribute (``containers``: all its values, by path)."""

    # weak: ``_READS`` holds these for as long as the module ORT wraps lives, and that module is among them
    modules: dict[int, tuple[weakref.ref[torch.nn.Module], str]] = field(default_factory=dict)
    numbers: dict[tuple[int, str], list[Any]] = field(default_factory=dict)
    tensors: dict[tuple[int, str], list[tuple[int, int]]] = field(default_factory=dict)
    items: dict[tuple[int, str, str], list[Any]] = field(default_factory=dict)
    containers: dict[tuple[int, str], list[list[Any]]] = field(default_factory=dict)
    # id of an hparams or trainer object read during the trace -> the module and attribute it was read from
    watched: dict[int, tuple[int, str]] = field(default_factory=dict)
    # module-level values the user's forward methods name: (the Python module's name, the global's) -> snapshot
    globals: dict[tuple[str, str], Any] = field(default_factory=dict)
    # the namespaces those values are read from again, by the Python module's name: not necessarily
    # ``sys.modules[name]`` (a model file run with ``importlib``'s ``exec_module`` and never registered there)
    namespaces: dict[str, dict[str, Any]] = field(default_factory=dict)


_READS: weakref.WeakKeyDictionary[torch.nn.Module, PythonReads] = weakref.WeakKeyDictionary()


def reads_of(module: torch.nn.Module) -> PythonReads:
    """What the exports of ``module`` (the module ORT wraps) read, accumulated over its exports."""
    return _READS.setdefault(module, PythonReads())


def forget_reads(module: torch.nn.Module) -> None:
    """Drop what the exports of ``module`` read: its graphs are exported again, and record anew."""
    _READS.pop(module, None)


@contextlib.contextmanager
def recorded_reads(reads: PythonReads, modules: dict[int, tuple[torch.nn.Module, str]]) -> Iterator[None]:
    """Record into ``reads`` the attributes of ``modules`` (id -> module and its name) that code read
    while tracing inside the block."""
    from lightning.fabric.utilities.data import AttributeDict
    from lightning.pytorch import Trainer

    _add_modules(reads, modules)
    reads.namespaces.update(_namespaces(modules))
    for module, _ in modules.values():
        reads.globals.update(_global_numbers(type(module)))
    original = torch.nn.Module.__getattribute__

    def __getattribute__(self: torch.nn.Module, name: str) -> Any:
        value = original(self, name)
        if name in _IGNORED or not torch.jit.is_tracing() or id(self) not in modules:
            return value
        if isinstance(value, _NUMBERS) or (isinstance(value, _OTHER_VALUES) and _public(name)):
            _add(reads.numbers.setdefault((id(self), name), []), plain(value))
        elif (
            type(value) is torch.Tensor and name in original(self, "__dict__") and name not in hooked_weight_names(self)
        ):
            _add(reads.tensors.setdefault((id(self), name), []), (id(value), tensor_version(value)))
        elif isinstance(value, (AttributeDict, Trainer)):
            # the name the user reads it by (hparams, trainer) over the one its property reads (_hparams)
            if reads.watched.get(id(value), ("", "_"))[1].startswith("_"):
                reads.watched[id(value)] = (id(self), name)
        elif _is_config(value) and name not in _internal_names():
            values = values_in(value)
            if values is not None:
                reads.containers.setdefault((id(self), name), values)
        return value

    original_getattr = torch.nn.Module.__getattr__

    def __getattr__(self: torch.nn.Module, name: str) -> Any:
        """After ``__getattribute__``: parameters, buffers, submodules; else the attribute is missing (unless
        the class's own ``__getattr__`` looks further, as lightning_ort's adapter does in its owner)."""
        try:
            return original_getattr(self, name)
        except AttributeError:
            mine = type(self).__getattr__ is __getattr__
            if mine and torch.jit.is_tracing() and id(self) in modules and _public(name):
                _add(reads.numbers.setdefault((id(self), name), []), ABSENT)
            raise

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
        stack.enter_context(_patched(torch.nn.Module, "__getattr__", __getattr__))
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


def _forward_namespace(cls: type) -> dict[str, Any] | None:
    """The module-level namespace of ``cls.forward``, for a class outside torch and Lightning."""
    forward = getattr(cls, "forward", None)
    namespace = getattr(forward, "__globals__", None)
    if namespace is None or getattr(forward, "__code__", None) is None:
        return None
    return None if str(namespace.get("__name__")).startswith(("torch.", "lightning.")) else namespace


def _namespaces(modules: dict[int, tuple[torch.nn.Module, str]]) -> dict[str, dict[str, Any]]:
    """The :func:`_forward_namespace` of each of ``modules``' classes, by the Python module's name."""
    found = {}
    for module, _ in modules.values():
        namespace = _forward_namespace(type(module))
        if namespace is not None:
            found[namespace.get("__name__", "")] = namespace
    return found


def _global_numbers(cls: type) -> dict[tuple[str, str], Any]:
    """Snapshots of the module-level values ``cls.forward`` names (``x / TEMPERATURE``, ``SCHEDULE["scale"]``):
    the trace holds them as constants too."""
    namespace = _forward_namespace(cls)
    if namespace is None:
        return {}
    names: set[str] = set()
    codes = [cls.forward.__code__]
    while codes:
        current = codes.pop()
        names.update(current.co_names)
        codes.extend(constant for constant in current.co_consts if isinstance(constant, types.CodeType))
    module_name = namespace.get("__name__", "")
    snapshots = {(module_name, name): snapshot(namespace[name]) for name in names if name in namespace}
    return {key: value for key, value in snapshots.items() if value is not None}


def snapshot(value: Any) -> Any:
    """A global's value as the graph may hold it: a number (or a string, an enum, None), or the values of
    a plain container; None for anything else (a function, a class, a Python module)."""
    if isinstance(value, (*_NUMBERS, *_OTHER_VALUES)) and value is not None:
        return plain(value)
    if isinstance(value, _CONTAINERS) or (dataclasses.is_dataclass(value) and not isinstance(value, type)):
        values = values_in(value)
        return None if values is None else {"values": values}
    return None


def _global(module_name: str, name: str, namespaces: dict[str, dict[str, Any]]) -> Any:
    namespace = namespaces.get(module_name)
    if namespace is None:
        module = sys.modules.get(module_name)
        namespace = None if module is None else vars(module)
    return None if namespace is None else namespace.get(name)


def _add(values: list[Any], value: Any) -> None:
    if value not in values:
        values.append(value)


@functools.cache
def _internal_names() -> frozenset[str]:
    """Attributes torch and Lightning keep on every module (``__dict__``, ``_modules``, hooks): not configs."""
    from lightning.pytorch import LightningModule

    return frozenset({"__dict__", *vars(torch.nn.Module()), *vars(LightningModule())})


def _public(name: str) -> bool:
    return not name.startswith("_") and name not in _internal_names()


def plain(value: Any) -> Any:
    """``value`` as recorded and compared: an enum member as its qualified name, the rest as it is."""
    if isinstance(value, enum.Enum):
        return f"<{type(value).__module__}.{type(value).__qualname__}.{value.name}>"
    return value


def _is_config(value: Any) -> bool:
    """Whether ``value`` is a plain container or a configuration object (a dataclass, an instance of a
    user's class), whose values a forward may read: not a module, tensor, function or library object."""
    if isinstance(value, _CONTAINERS):
        return True
    if isinstance(value, (torch.nn.Module, torch.Tensor, type, types.FunctionType, types.MethodType, types.ModuleType)):
        return False
    if dataclasses.is_dataclass(value):
        return True
    return hasattr(value, "__dict__") and not type(value).__module__.startswith(_LIBRARIES)


def _items(container: Any) -> Any:
    if isinstance(container, Mapping):
        return container.items()
    if isinstance(container, (list, tuple)):
        return enumerate(container)
    return vars(container).items()


def values_in(container: Any) -> list[list[Any]] | None:
    """The plain values ``container`` holds, nested containers included, as ``[path, value]`` pairs; None
    when it holds more than ``_MAX_ITEMS`` entries (a vocabulary holds no schedule) or cannot be read."""
    try:
        return _values_in(container)
    except Exception:  # a config library's own errors (an OmegaConf value still missing): not for us to raise
        return None


def _values_in(container: Any) -> list[list[Any]] | None:
    values: list[list[Any]] = []
    pending: list[tuple[list[Any], Any]] = [([], container)]
    seen = {id(container)}
    count = 0
    while pending:
        path, current = pending.pop(0)
        for item, value in _items(current):
            key = item if isinstance(item, (str, int)) else repr(plain(item))  # kept as JSON with a cached export
            count += 1
            if count > _MAX_ITEMS:
                return None
            if isinstance(value, (*_NUMBERS, *_OTHER_VALUES)):
                values.append([[*path, key], plain(value)])
            elif len(path) < _MAX_DEPTH and id(value) not in seen and _is_config(value):
                seen.add(id(value))
                pending.append(([*path, key], value))
    return values


def _item(container: Any, key: str) -> Any:
    return container.get(key) if isinstance(container, Mapping) else getattr(container, key, None)


def _add_modules(reads: PythonReads, modules: dict[int, tuple[torch.nn.Module, str]]) -> None:
    reads.modules.update({key: (weakref.ref(module), path) for key, (module, path) in modules.items()})


def _module(reads: PythonReads, key: int) -> tuple[torch.nn.Module | None, str]:
    """The module recorded under ``key`` (None once it is gone: replaced, its reads no longer matter) and its path."""
    reference, path = reads.modules[key]
    return reference(), path


def changed_read(module: torch.nn.Module) -> str | None:
    """Why ``module``'s graphs no longer compute what its forward would (an attribute their export
    read has another value now), or None."""
    reads = _READS.get(module)
    if reads is None:
        return None
    for (key, name), values in reads.numbers.items():
        module, path = _module(reads, key)
        if module is None:
            continue
        current = plain(getattr(module, name, ABSENT))
        if not _is_each(current, values):
            fix = _NUMBER_FIX
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and name == "momentum":
                fix = "none needed when a callback changed it (StochasticWeightAveraging's BatchNorm update does)"
            return _changed_number(f"{path}.{name}", values[0], current, fix)
    for (module_name, name), value in reads.globals.items():
        current = snapshot(_global(module_name, name, reads.namespaces))
        if current != value or type(current) is not type(value):
            if isinstance(value, dict):
                return _changed_values(f"the global {module_name}.{name}", value["values"])
            return _changed_number(f"the global {module_name}.{name}", value, current)
    for (key, name, item), values in reads.items.items():
        module, path = _module(reads, key)
        if module is None:
            continue
        current = _item(getattr(module, name, None), item)
        if not _is_each(current, values):
            return _changed_number(f"{path}.{name}.{item}", values[0], current)
    for (key, name), recorded in reads.containers.items():
        module, path = _module(reads, key)
        if module is None:
            continue
        if _current_values(getattr(module, name, None)) != recorded:
            return _changed_values(f"{path}.{name}", recorded)
    for (key, name), tensors in reads.tensors.items():
        module, path = _module(reads, key)
        if module is None:
            continue
        current = getattr(module, name, None)
        state = (id(current), tensor_version(current)) if isinstance(current, torch.Tensor) else None
        if any(state != tensor for tensor in tensors):
            return (
                f"its forward reads the plain tensor attribute {path}.{name}, which changed after ORT exported "
                "the graph; the graph holds its old value as a constant. Fix: register it as a buffer "
                "(self.register_buffer), which ORT reads on every call"
            )
    return None


def _changed_number(what: str, was: Any, now: Any, fix: str = _NUMBER_FIX) -> str:
    def shown(value: Any) -> str:
        return "missing" if value == ABSENT else repr(value)

    return (
        f"its forward reads {what}, which was {shown(was)} when ORT exported the graph and is {shown(now)} now; the "
        f"graph holds the old value as a constant. Fix: {fix}"
    )


def _changed_values(what: str, recorded: list[list[Any]]) -> str:
    was = {".".join(map(str, where)): value for where, value in recorded}
    return (
        f"its forward reads {what}, whose values changed after ORT exported the graph (they were {was!r}); the "
        "graph holds the values it read as constants. Fix: pass such values to forward as tensors, or register "
        "them as buffers"
    )


def _holds(module: torch.nn.Module, name: str, values: list[Any]) -> bool:
    return _is_each(plain(getattr(module, name, ABSENT)), values)


def _is_each(current: Any, values: list[Any]) -> bool:
    return isinstance(current, (*_NUMBERS, str, type(None))) and all(
        current == value and type(current) is type(value) for value in values
    )


def _current_values(container: Any) -> list[list[Any]] | None:
    return values_in(container) if _is_config(container) else None


def to_record(reads: PythonReads) -> dict[str, list[Any]]:
    """``reads`` by module name, in JSON's types, to be kept with a cached export (trace_record.py)."""
    return {
        "numbers": [[reads.modules[key][1], name, values] for (key, name), values in reads.numbers.items()],
        "tensors": [[reads.modules[key][1], name] for key, name in reads.tensors],
        "items": [[reads.modules[key][1], name, item, values] for (key, name, item), values in reads.items.items()],
        "containers": [[reads.modules[key][1], name, values] for (key, name), values in reads.containers.items()],
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
    containers: dict[tuple[int, str], list[list[Any]]] = {}
    for path, name, expected in record.get("containers", []):
        owner = next(
            (module for module in by_name.get(path, []) if _current_values(getattr(module, name, None)) == expected),
            None,
        )
        if owner is None:
            return f"the values in {path}.{name} are not as when the cached graph was exported"
        containers[(id(owner), name)] = expected
    namespaces = _namespaces(modules)
    for module_name, name, value in record.get("globals", []):
        if snapshot(_global(module_name, name, namespaces)) != value:
            return f"the global {module_name}.{name} is not {value!r} as when the cached graph was exported"
    tensors: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for path, name in record["tensors"]:
        owner = next((module for module in by_name.get(path, []) if name in vars(module)), None)
        if owner is None or type(vars(owner)[name]) is not torch.Tensor:
            return f"{path}.{name} is not the plain tensor attribute the cached graph read"
        tensor = vars(owner)[name]
        tensors[(id(owner), name)] = [(id(tensor), tensor_version(tensor))]
    _add_modules(reads, modules)
    reads.numbers.update(numbers)
    reads.items.update(items)
    reads.containers.update(containers)
    reads.globals.update({(module_name, name): value for module_name, name, value in record.get("globals", [])})
    reads.namespaces.update(namespaces)
    reads.tensors.update(tensors)
    return None


def _holds_item(container: Any, item: str, values: list[Any]) -> bool:
    return _is_each(_item(container, item), values)
