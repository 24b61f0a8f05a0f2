"""Dataclass instances in and out of ORT, which flattens only tensors, sequences and mappings.

Before ORT sees a forward's inputs, and before the exported forward returns, each dataclass instance
(``@dataclass class Output: logits: Tensor; hidden: Tensor``) becomes a mapping of its fields whose
type remembers the dataclass; the forward gets, and the caller receives, the dataclass again.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch


class DataclassFields(dict):  # type: ignore[type-arg]
    """The fields of one dataclass instance: a mapping, which ORT can flatten and rebuild."""

    dataclass_type: ClassVar[type]


@functools.cache
def _fields_type(cls: type) -> type[DataclassFields]:
    return type(f"{cls.__name__}Fields", (DataclassFields,), {"dataclass_type": cls})


def to_mappings(value: Any) -> Any:
    """``value`` with each dataclass instance in it (through tuples, lists and mappings) replaced by its
    :class:`DataclassFields`; ``value`` itself when it holds none."""
    return _transform(value, _fields_of)


def from_mappings(value: Any) -> Any:
    """``value`` with each :class:`DataclassFields` in it replaced by the dataclass instance it came from."""
    return _transform(value, _instance_of)


def _fields_of(value: Any) -> Any:
    # a dataclass that is a mapping (Hugging Face's ModelOutput) is flattened by ORT as a mapping
    if not dataclasses.is_dataclass(value) or isinstance(value, (type, Mapping)):
        return _UNCHANGED
    fields = {field.name: to_mappings(getattr(value, field.name)) for field in dataclasses.fields(value)}
    return _fields_type(type(value))(fields)


def _instance_of(value: Any) -> Any:
    if not isinstance(value, DataclassFields):
        return _UNCHANGED
    cls = value.dataclass_type
    fields = {key: from_mappings(item) for key, item in value.items()}
    instance = cls(**{field.name: fields[field.name] for field in dataclasses.fields(cls) if field.init})
    for field in dataclasses.fields(cls):
        if not field.init:  # a field __post_init__ computes: the value the forward gave it
            object.__setattr__(instance, field.name, fields[field.name])
    return instance


_UNCHANGED = object()


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
