"""Hugging Face transformers' ``Cache`` objects (``DynamicCache``, ``EncoderDecoderCache``, ...) in and out of ORT.

ORT flattens only tensors, sequences and mappings. A causal LM keeps ``use_cache=True`` by default, so
in training its model creates a ``DynamicCache``, passes it to every layer, each layer appends its
key and value states to it, and the model returns it.

- A cache *returned* by forward becomes a mapping of its tensors, keyed by where they sit in the
  object (``layers.0.keys``), whose type remembers the rest of the object (layer classes, flags,
  dtypes); the caller receives an equal cache object rebuilt from them.
- A cache *given to* forward goes in the same way. Inside ORT's forward it is rebuilt and used
  (updated) as in eager; the tensors forward changed in it come out of the graph as extra outputs,
  and the caller's own cache object gets the state eager's forward would have left in it. A forward
  that returns the cache it was given returns the caller's object.

The non-tensor state of a cache (which layers exist and are initialized, sliding-window flags) is
part of the mapping's keys, so a call with a cache in another state than at the export makes ORT
export again instead of running a graph traced for the other state.
"""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Iterator
from typing import Any, ClassVar

import torch

Path = tuple[str | int, ...]
# Non-tensor values a cache may hold, kept as they are in the rebuilt object
_PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device, type)
_MAX_DEPTH = 8


class CacheFields(dict):  # type: ignore[type-arg]
    """The tensors of one cache object by path (``"layers.0.keys"``); the type holds the rest of the object."""

    skeleton: ClassVar[Any]  # the object with its tensors replaced by None
    paths: ClassVar[dict[str, Path]]
    # tensors the forward left in a cache it was given unchanged: their path in the object given
    aliases: ClassVar[dict[Path, Path]]


class InputCache(dict):  # type: ignore[type-arg]
    """Forward returned the cache it was given (the ``index``-th cache among its inputs)."""

    index: ClassVar[int]


class CacheUpdates(dict):  # type: ignore[type-arg]
    """A forward's output (``"output"``) and the states of the caches it was given (``"caches"``), in order."""


def is_cache(value: Any) -> bool:
    """Whether ``value`` is a transformers ``Cache`` (without importing transformers)."""
    cache_utils = sys.modules.get("transformers.cache_utils")
    return cache_utils is not None and isinstance(value, cache_utils.Cache)


def _walkable(value: Any) -> bool:
    return type(value).__module__.startswith("transformers.") and hasattr(value, "__dict__")


def _leaves(value: Any, path: Path = (), depth: int = 0) -> Iterator[tuple[Path, Any]]:
    """Each tensor and plain value in the object tree of a cache, with its path.

    Raises:
        TypeError: the cache holds something else (a CUDA stream of an offloading cache, a quantizer).
    """
    if isinstance(value, torch.Tensor) or isinstance(value, _PLAIN):
        yield path, value
        return
    if depth >= _MAX_DEPTH:
        raise TypeError(f"a transformers cache nested deeper than {_MAX_DEPTH} levels")
    if isinstance(value, (list, tuple)):
        items: Any = enumerate(value)
    elif isinstance(value, dict) and all(isinstance(key, (str, int)) for key in value):
        items = value.items()
    elif _walkable(value):
        items = vars(value).items()
    else:
        raise TypeError(f"a transformers cache holding a {type(value).__name__} at {_name(path) or 'its top'}")
    yield path, type(value)
    for key, item in items:
        yield from _leaves(item, (*path, key), depth + 1)


def _name(path: Path) -> str:
    return ".".join(map(str, path))


def _state_key(value: Any) -> tuple[Any, ...]:
    """What of a cache the graph depends on besides its tensors' values."""
    return tuple(
        (path, (leaf.dtype, leaf.dim()) if isinstance(leaf, torch.Tensor) else leaf) for path, leaf in _leaves(value)
    )


def tensors_of(value: Any) -> dict[Path, torch.Tensor]:
    """The tensors in the object tree of a cache, by path."""
    return {path: leaf for path, leaf in _leaves(value) if isinstance(leaf, torch.Tensor)}


@functools.lru_cache(maxsize=256)
def _fields_type(key: tuple[Any, ...], aliases: tuple[tuple[Path, Path], ...]) -> type[CacheFields]:
    return type(
        "CacheFields",
        (CacheFields,),
        {"skeleton": None, "paths": {}, "aliases": dict(aliases), "state": key},
    )


def to_fields(cache: Any, given: dict[int, Path] | None = None) -> CacheFields:
    """``cache`` as a mapping of its tensors; with ``given`` (the ids of the tensors of the cache forward was given,
    with their paths), the tensors still there are left out and named in the type's ``aliases``."""
    tensors = tensors_of(cache)
    aliases = {path: given[id(tensor)] for path, tensor in tensors.items() if given and id(tensor) in given}
    fields_type = _fields_type(_state_key(cache), tuple(sorted(aliases.items(), key=repr)))
    if fields_type.skeleton is None:
        memo: dict[int, Any] = {id(tensor): None for tensor in tensors.values()}
        memo[id(memo)] = list(tensors.values())  # deepcopy's keep-alive list: the ids above stay valid
        fields_type.skeleton = copy.deepcopy(cache, memo)
        fields_type.paths = {_name(path): path for path in tensors if path not in aliases}
        # each state gets its own key, so that ORT's input schema differs between states
        fields_type.paths[f"state:{id(fields_type)}"] = ()
    return fields_type(
        {name: (tensors[path] if path else None) for name, path in fields_type.paths.items() if path not in aliases}
    )


def from_fields(fields: CacheFields, given: Any = None) -> Any:
    """The cache object ``fields`` came from (its ``aliases`` read from ``given``, the cache forward was given)."""
    cache = copy.deepcopy(type(fields).skeleton)
    paths = type(fields).paths
    for name, tensor in fields.items():
        if paths[name]:
            _set(cache, paths[name], tensor)
    if type(fields).aliases:
        given_tensors = tensors_of(given)
        for path, source in type(fields).aliases.items():
            _set(cache, path, given_tensors[source])
    return cache


def _set(root: Any, path: Path, value: Any) -> None:
    *parents, last = path
    for step in parents:
        root = root[step] if isinstance(root, (list, tuple, dict)) else getattr(root, str(step))
    if isinstance(root, (list, dict)):
        root[last] = value
    elif isinstance(root, tuple):
        raise TypeError("a transformers cache holding a tensor in a tuple")
    else:
        object.__setattr__(root, str(last), value)


def take_state(cache: Any, state: Any) -> None:
    """Make ``cache`` hold what ``state`` (a cache object of the same class) holds, keeping its identity."""
    cache.__dict__.clear()
    cache.__dict__.update(state.__dict__)


@functools.cache
def input_cache_type(index: int) -> type[InputCache]:
    return type("InputCache", (InputCache,), {"index": index})
