"""A module that lets ORT export another module's ``forward`` without owning that module."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_ort.dataclass_io import GivenCache, from_mappings, to_mappings


class ForwardAdapter(torch.nn.Module):
    """Holds ``owner``'s direct submodules, parameters and buffers and runs ``type(owner).forward``.

    ORT exports and trains this adapter. The owner stays untouched: its ``state_dict`` keys do not
    change and Lightning can keep setting attributes on it. Attribute lookups the adapter cannot
    answer (hyper-parameters, helper methods) are forwarded to the owner.
    """

    def __init__(self, owner: torch.nn.Module) -> None:
        # Not super().__init__(): for plain modules the owner's class is a base (see for_module),
        # and its constructor's arguments are unknown here.
        torch.nn.Module.__init__(self)
        object.__setattr__(self, "_owner", owner)
        # Direct dict writes: add_module() would find these names on the owner through __getattr__.
        self._modules.update(owner._modules)
        self._parameters.update(owner._parameters)
        self._buffers.update(owner._buffers)
        self._non_persistent_buffers_set.update(owner._non_persistent_buffers_set)
        self.training = owner.training

    def take_owner_state(self) -> None:
        """Hold the owner's submodules, parameters and buffers as they are now: one replaced since (``self.center
        = ...`` in ``training_step``) is a new object the adapter's own dictionaries do not have."""
        owner = object.__getattribute__(self, "_owner")
        self._modules.update(owner._modules)
        self._parameters.update(owner._parameters)
        self._buffers.update(owner._buffers)
        self._non_persistent_buffers_set.update(owner._non_persistent_buffers_set)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_owner"), name)

    def __dir__(self) -> list[str]:
        # Module.__dir__ lists dir(self.__class__), which for_module may point at the owner's class
        keys = {*dir(type(self)), *self.__dict__, *self._parameters, *self._modules, *self._buffers}
        return sorted(key for key in keys if not key[0].isdigit())

    def __deepcopy__(self, memo: dict[int, Any]) -> ForwardAdapter:
        # ORT deep-copies the module to infer its output schema; the owner (and its Trainer) is shared.
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        for key, value in self.__dict__.items():
            object.__setattr__(clone, key, value if key == "_owner" else copy.deepcopy(value, memo))
        return clone

    @classmethod
    def for_module(cls, owner: torch.nn.Module) -> ForwardAdapter:
        """An adapter whose ``forward`` is the owner class's ``forward`` (same signature, for ORT's input parsing).

        For plain modules the owner's class is also a base, so ``forward`` finds methods such as
        ``Sequential.__iter__``. A LightningModule is not: ORT inspects every attribute of the module
        it wraps, and many LightningModule properties fail outside a running Trainer. Every adapter
        reports the owner's class as ``__class__`` (``type()`` still gives the adapter's), so that
        zero-argument ``super()`` in the owner's ``forward`` finds the parent's methods and code keyed on
        ``self.__class__`` finds the owner's entry.
        """
        owner_cls = type(owner)
        # reads of ``self.__class__`` in forward see the owner's class: transformers keys what a model records
        # (hidden states, attentions) on ``str(model.__class__)``, and would record nothing for the adapter's
        namespace: dict[str, Any] = {
            "forward": _with_dataclasses_as_mappings(owner_cls.forward),
            "__class__": property(lambda self: owner_cls),
        }
        bases: tuple[type, ...] = (cls,) if isinstance(owner, pl.LightningModule) else (cls, owner_cls)
        adapter_cls = type(f"{owner_cls.__name__}ORTAdapter", bases, namespace)
        return adapter_cls(owner)


def _with_dataclasses_as_mappings(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` taking and returning dataclass instances as :mod:`~lightning_ort.dataclass_io` mappings, which
    ORT can flatten (its signature, which ORT reads, stays ``forward``'s)."""

    @functools.wraps(forward)
    def wrapped(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        given: list[GivenCache] = []  # transformers caches among the inputs: what forward leaves in them is output
        args, kwargs = from_mappings(args, given), from_mappings(kwargs, given)
        return to_mappings(forward(self, *args, **kwargs), given)

    return wrapped
