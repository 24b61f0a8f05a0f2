"""Python state a traced forward changes on the user's modules, and putting it back.

ORT runs the traced graph from the export on, never the forward's Python again. So a forward that
changes plain attributes (a counter, a flag) or stores tensors computed from its inputs on a module
(an auxiliary loss, a Transformer-XL memory ``self.mems = [h.detach()]``, a truncated-BPTT state
``self.hidden = (h, c)``) is refused by the guard. Tensors held in a list, tuple or dict attribute
count too: they went unseen, and ORT trained as if the memory stayed empty (step-1 loss 3.933
against eager's 3.986 on a Transformer-XL).

The export runs forward besides the step's own call (ORT's output-schema run on a copy shares the
owner's objects, and the trace itself). When the module then falls back, PyTorch runs forward again,
and its side effects would count more than once (a list appended to twice, a torchmetrics
``update`` in forward counting the first batch again). :meth:`PythonState.restore` puts the
attributes, the plain tensors (their values too, when changed in place) and the contents of list and
dict attributes back as they were before the export.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from lightning_ort.engine.export.guards.module_hooks import hooked_weight_names

_PLAIN = (bool, int, float, str, type(None))
_CONTAINERS = (list, tuple, dict)
_MAX_ITEMS = 1024  # larger containers (a vocabulary) hold no state of a step
_MAX_DEPTH = 3
_MAX_COPIED = 1 << 22  # elements of a plain tensor attribute copied to undo in-place changes (16 MiB of float32)
# nn.Module's own bookkeeping (parameters, hooks, the training flag) and the adapter's owner
_INTERNAL = frozenset({*vars(torch.nn.Module()), "_owner"})
_MISSING = object()

Key = tuple[int, str]


def tensor_version(tensor: torch.Tensor) -> int | bytes:
    """What changes when ``tensor`` is changed in place: its version counter, or the bytes of an inference
    tensor, which has none (made under ``torch.inference_mode``: torchmetrics states updated in a
    ``Trainer.validate`` or ``predict``)."""
    if tensor.is_inference():
        return tensor.detach().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()
    return tensor._version


def _elements(value: Any, depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors inside a list, tuple or dict, with their paths (``[0]``, ``['h']``)."""
    if depth >= _MAX_DEPTH or len(value) > _MAX_ITEMS:
        return
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for index, element in items:
        if isinstance(element, (torch.Tensor, *_CONTAINERS)):
            # a key that is no plain value (Lightning keys parameters) by its type: its repr may print a tensor
            path = f"[{index!r}]" if isinstance(index, (str, int)) else f"[<{type(index).__name__}>]"
            if isinstance(element, torch.Tensor):
                yield path, element
            else:
                yield from ((path + inner, tensor) for inner, tensor in _elements(element, depth + 1))


def _contents(value: Any) -> Any:
    """A shallow copy of a list's or dict's contents (changed in place, they are put back in place)."""
    if isinstance(value, list):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return None


def _moved(value: list[Any] | dict[Any, Any], contents: Any) -> bool:
    """Whether a list or dict holds other objects than ``contents`` (its shallow copy)."""
    if len(value) != len(contents):
        return True
    if isinstance(value, dict):  # by identity: keys may be tensors (Lightning keys parameters), whose == is no bool
        old = {id(key): item for key, item in contents.items()}
        return any(id(key) not in old or old[id(key)] is not item for key, item in value.items())
    return any(new is not old for new, old in zip(value, contents, strict=True))


# nn.Module's dicts of forward hooks, and the dicts that hold more about some of them (by the same handle id)
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks")
_HOOK_EXTRAS = ("_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")


def _hook_ids(module: torch.nn.Module) -> frozenset[int]:
    return frozenset(hook_id for name in _HOOK_DICTS for hook_id in getattr(module, name, {}))


def _remove_hooks_but(module: torch.nn.Module, kept: frozenset[int]) -> None:
    """Remove ``module``'s forward hooks other than ``kept`` (by handle id)."""
    for name in (*_HOOK_DICTS, *_HOOK_EXTRAS):
        hooks = getattr(module, name, None)
        if hooks:
            for hook_id in [hook_id for hook_id in hooks if hook_id not in kept]:
                del hooks[hook_id]


class PythonState:
    """The Python attributes of ``modules`` (id -> module and the name the user knows it by) as they were
    when it was made: plain values, plain tensors, and list, tuple and dict attributes with their contents."""

    def __init__(self, modules: dict[int, tuple[torch.nn.Module, str]]) -> None:
        self._modules = modules
        self._before = {key: (value, _contents(value)) for key, value in self._attributes()}
        self._tensors_before = self.tensors()
        # values of the plain tensors, to undo in-place changes (a torchmetrics state's ``+=``)
        self._values = {
            key: (tensor, tensor_version(tensor), tensor.detach().clone())
            for key, tensor in self._tensors_before.items()
            if tensor.numel() <= _MAX_COPIED
        }
        # the forward hooks each module has: a forward may add some once, marking that with an attribute
        # (transformers' output-capturing hooks), and restoring the attribute alone would have them added twice
        self._hooks = {key: _hook_ids(module) for key, (module, _) in modules.items()}

    def where(self, key: Key) -> str:
        """``key`` as the user reads it (``self.mems[0]``, ``encoder.cache``)."""
        return f"{self._modules[key[0]][1]}.{key[1]}"

    def _attributes(self) -> Iterator[tuple[Key, Any]]:
        for key, (module, _) in self._modules.items():
            for name, value in vars(module).items():
                if name not in _INTERNAL and isinstance(value, (*_PLAIN, torch.Tensor, *_CONTAINERS)):
                    yield (key, name), value

    def tensors(self) -> dict[Key, torch.Tensor]:
        """The plain tensor attributes (not parameters or buffers), also those inside containers."""
        found: dict[Key, torch.Tensor] = {}
        for (key, name), value in self._attributes():
            if isinstance(value, torch.Tensor):
                if name not in hooked_weight_names(self._modules[key][0]):  # pruning's and weight norm's
                    found[(key, name)] = value
            elif isinstance(value, _CONTAINERS):
                found.update(((key, name + path), tensor) for path, tensor in _elements(value))
        return found

    def stored(self, computed_from_inputs: Callable[[torch.Tensor], bool]) -> list[str]:
        """Where the forward, so far, stored tensors ``computed_from_inputs`` that were not there before."""
        found = (
            self.where(key)
            for key, tensor in self.tensors().items()
            if self._tensors_before.get(key) is not tensor and computed_from_inputs(tensor)
        )
        return list(dict.fromkeys(found))

    def changed(self) -> list[str]:
        """The plain attributes (numbers, strings, flags) whose values changed, and the list and dict attributes
        that were assigned or whose contents changed (``self.calls.append(1)``)."""
        found = []
        for key, value in self._attributes():
            old, contents = self._before.get(key, (_MISSING, None))
            if isinstance(value, _PLAIN):
                moved = old != value
            elif isinstance(value, (list, dict)):
                moved = old is not value or _moved(value, contents)
            else:
                continue
            if moved:
                found.append(self.where(key))
        return list(dict.fromkeys(found))

    def restore(self) -> None:
        """Put every attribute back as it was, with the contents of its lists and dicts; remove new attributes and
        new forward hooks."""
        for (key, name), _ in list(self._attributes()):
            if (key, name) not in self._before:
                del vars(self._modules[key][0])[name]
        for (key, name), (value, contents) in self._before.items():
            state = vars(self._modules[key][0])
            if state.get(name, _MISSING) is not value:
                state[name] = value
            if isinstance(value, list):
                value[:] = contents
            elif isinstance(value, dict):
                value.clear()
                value.update(contents)
        for key, (module, _) in self._modules.items():
            _remove_hooks_but(module, self._hooks[key])
        for tensor, version, value in self._values.values():
            if tensor_version(tensor) != version:
                # an inference tensor can be written only in inference mode
                with torch.inference_mode() if tensor.is_inference() else torch.no_grad():
                    tensor.copy_(value)
