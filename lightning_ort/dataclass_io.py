"""Dataclass instances in and out of ORT, which flattens only tensors, sequences and mappings.

Before ORT sees a forward's inputs, and before the exported forward returns, each dataclass instance
(``@dataclass class Output: logits: Tensor; hidden: Tensor``) becomes a mapping of its fields whose
type remembers the dataclass; the forward gets, and the caller receives, the dataclass again.
Hugging Face transformers' ``Cache`` objects go through the same way (:mod:`~lightning_ort.cache_io`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch

from lightning_ort import cache_io


class DataclassFields(dict):  # type: ignore[type-arg]
    """The fields of one dataclass instance: a mapping, which ORT can flatten and rebuild."""

    dataclass_type: ClassVar[type]


@functools.cache
def _fields_type(cls: type) -> type[DataclassFields]:
    return type(f"{cls.__name__}Fields", (DataclassFields,), {"dataclass_type": cls})


# A cache object forward was given (rebuilt inside ORT's forward), with the paths of the tensors it held then
GivenCache = tuple[Any, dict[int, cache_io.Path]]


def to_mappings(value: Any, given: list[GivenCache] | None = None) -> Any:
    """``value`` with each dataclass instance in it (through tuples, lists and mappings) replaced by its
    :class:`DataclassFields` and each transformers cache by its :class:`~lightning_ort.cache_io.CacheFields`;
    ``value`` itself when it holds none.

    With ``given`` (a forward's output, and the caches its inputs held, :func:`from_mappings`), the result is a
    :class:`~lightning_ort.cache_io.CacheUpdates` that also holds what forward left in those caches."""
    converted = _transform(value, functools.partial(_fields_of, given=given or []))
    if not given:
        return converted
    caches = tuple(cache_io.to_fields(cache, tensors) for cache, tensors in given)
    return cache_io.CacheUpdates(output=converted, caches=caches)


def from_mappings(value: Any, given: list[GivenCache] | None = None, inputs: Any = None) -> Any:
    """``value`` with each :class:`DataclassFields` in it replaced by the dataclass instance it came from, and each
    :class:`~lightning_ort.cache_io.CacheFields` by a cache object; those are appended to ``given`` when it is a list.

    A :class:`~lightning_ort.cache_io.CacheUpdates` (an output of ORT's forward) has its states taken by the caches
    in ``inputs`` (the caller's arguments), which the output then holds where forward returned them."""
    if isinstance(value, cache_io.CacheUpdates):
        caches = [cache for cache in _transform_leaves(inputs) if cache_io.is_cache(cache)]
        states = [cache_io.from_fields(fields, cache) for fields, cache in zip(value["caches"], caches, strict=True)]
        output = _transform(value["output"], functools.partial(_instance_of, given=None, inputs=caches))
        for cache, state in zip(caches, states, strict=True):
            cache_io.take_state(cache, state)
        return output
    return _transform(value, functools.partial(_instance_of, given=given, inputs=None))


def _fields_of(value: Any, given: list[GivenCache]) -> Any:
    if cache_io.is_cache(value):
        index = next((index for index, (cache, _) in enumerate(given) if cache is value), None)
        return cache_io.to_fields(value) if index is None else cache_io.input_cache_type(index)()
    # a dataclass that is a mapping (Hugging Face's ModelOutput) is flattened by ORT as a mapping
    if not dataclasses.is_dataclass(value) or isinstance(value, (type, Mapping)):
        return _UNCHANGED
    convert = functools.partial(_fields_of, given=given)
    fields = {field.name: _transform(getattr(value, field.name), convert) for field in dataclasses.fields(value)}
    return _fields_type(type(value))(fields)


def _instance_of(value: Any, given: list[GivenCache] | None, inputs: list[Any] | None) -> Any:
    if isinstance(value, cache_io.InputCache):
        assert inputs is not None
        return inputs[value.index]
    if isinstance(value, cache_io.CacheFields):
        cache = cache_io.from_fields(value)
        if given is not None:
            given.append((cache, {id(tensor): path for path, tensor in cache_io.tensors_of(cache).items()}))
        return cache
    if not isinstance(value, DataclassFields):
        return _UNCHANGED
    cls = value.dataclass_type
    convert = functools.partial(_instance_of, given=given, inputs=inputs)
    fields = {key: _transform(item, convert) for key, item in value.items()}
    instance = cls(**{field.name: fields[field.name] for field in dataclasses.fields(cls) if field.init})
    for field in dataclasses.fields(cls):
        if not field.init:  # a field __post_init__ computes: the value the forward gave it
            object.__setattr__(instance, field.name, fields[field.name])
    return instance


_UNCHANGED = object()


def _transform_leaves(value: Any) -> list[Any]:
    """The objects :func:`_transform` would offer its ``convert`` in ``value``, outermost first, in its order."""
    found: list[Any] = []

    def note(item: Any) -> Any:
        if cache_io.is_cache(item):
            found.append(item)
            return item  # not descended into
        if dataclasses.is_dataclass(item) and not isinstance(item, (type, Mapping)):
            for field in dataclasses.fields(item):
                _transform(getattr(item, field.name), note)
            return item
        return _UNCHANGED

    _transform(value, note)
    return found


def _transform(value: Any, convert: Callable[[Any], Any]) -> Any:
    """``value`` with ``convert`` applied to the outermost values it changes (it returns ``_UNCHANGED`` for
    the others), through tuples, lists and mappings, which are rebuilt only where something changed."""
    if isinstance(value, (torch.Tensor, str, int, float, bool)) or value is None:
        return value
    if type(value) is tuple and all(isinstance(item, torch.Tensor) for item in value):
        return value  # a forward's usual arguments, on every call
    converted = convert(value)
    if converted is not _UNCHANGED:
        return converted
    if isinstance(value, Mapping):
        items = {key: _transform(item, convert) for key, item in value.items()}
        if all(items[key] is item for key, item in value.items()):
            return value
        if type(value) is dict:
            return items
        return type(value)(**items) if all(isinstance(key, str) for key in items) else type(value)(items)
    if isinstance(value, (tuple, list)):
        parts = [_transform(item, convert) for item in value]
        if all(new is old for new, old in zip(parts, value, strict=True)):
            return value
        return value._make(parts) if hasattr(value, "_make") else type(value)(parts)  # _make: a NamedTuple
    return value
