"""Module patterns a traced ONNX graph cannot reproduce, found around ORT's export.

Each one trained silently differently from eager PyTorch before it was checked:

- a tensor turned into a Python integer by ``__index__`` (``for t in range(x.shape[1])``, a list
  index): under the tracer a size is a tensor, and ``range()`` reads it without the warning
  ``int()`` gives, so a loop over the sequence length stayed unrolled for the first batch's length;
- a parameter changed in place by ``forward`` (``nn.Embedding(max_norm=...)`` renormalises the rows
  it looks up): the graph computes with the change but never writes it back;
- Python forward hooks and pre-hooks on submodules: they run during the export only, so features
  captured by a hook were stale (weight normalisation and pruning hooks, which compute a weight
  from parameters, become part of the graph and are fine);
- embeddings with ``sparse=True``: ORT computes dense gradients;
- an input changed in place by ``forward`` (``x.mul_(2)``, ``x[:, 0] = 0``): ORT's graph works on
  its own copy, so the caller's tensor stayed unchanged where eager changes it.
"""

from __future__ import annotations

import contextlib
import dis
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.nn.utils import prune
from torch.nn.utils.weight_norm import WeightNorm

_SUBSCRIPTS = {"BINARY_SUBSCR", "STORE_SUBSCR", "BINARY_SLICE", "STORE_SLICE"}
# Hooks that compute a weight from parameters before each forward: the trace records the computation.
_TRACEABLE_HOOKS = (WeightNorm, prune.BasePruningMethod)


@contextlib.contextmanager
def index_conversions(locate: Callable[[], str | None]) -> Iterator[list[str]]:
    """Where (``locate()`` of the caller, e.g. ``file:line``) traced code called ``Tensor.__index__``."""
    seen: list[str] = []
    original = torch.Tensor.__index__

    def __index__(self: torch.Tensor) -> int:
        if torch.jit.is_tracing() and not _in_subscript(sys._getframe(1)):
            location = locate()
            if location is not None and location not in seen:
                seen.append(location)
        return original(self)

    torch.Tensor.__index__ = __index__  # type: ignore[method-assign,assignment]
    try:
        yield seen
    finally:
        torch.Tensor.__index__ = original  # type: ignore[method-assign]


def _in_subscript(frame: types.FrameType) -> bool:
    """Whether ``frame`` is subscripting (``x[:, :n]``): tensor indexing reads a traced size with
    ``__index__`` but records it in the trace as a dynamic value."""
    return dis.opname[frame.f_code.co_code[frame.f_lasti]] in _SUBSCRIPTS


def parameter_versions(module: torch.nn.Module) -> dict[str, int]:
    """Every parameter's in-place modification counter."""
    return {name: parameter._version for name, parameter in module.named_parameters()}


def changed_in_place(module: torch.nn.Module, versions: dict[str, int]) -> list[str]:
    """Parameters modified in place since ``versions`` was taken."""
    return [name for name, parameter in module.named_parameters() if versions.get(name, -1) != parameter._version]


@contextlib.contextmanager
def input_copies() -> Iterator[list[tuple[torch.Tensor, int]]]:
    """The copies of the module's input tensors ORT's export runs the forward on, with their
    in-place modification counters when copied."""
    from onnxruntime.training.ortmodule import _io

    copies: list[tuple[torch.Tensor, int]] = []
    original = _io.deepcopy_model_input

    def deepcopy_model_input(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        values = (*result[0], *result[1].values())
        # inference tensors (torch.inference_mode(): predict, validate) have no counter and go unchecked
        copies.extend(
            (value, value._version) for value in values if torch.is_tensor(value) and not value.is_inference()
        )
        return result

    _io.deepcopy_model_input = deepcopy_model_input
    try:
        yield copies
    finally:
        _io.deepcopy_model_input = original


def changed_inputs(copies: list[tuple[torch.Tensor, int]]) -> bool:
    """Whether the forward changed any of ``copies`` in place."""
    return any(tensor._version != version for tensor, version in copies)


def sparse_embeddings(module: torch.nn.Module) -> list[str]:
    """Embedding layers with ``sparse=True``."""
    layers = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    return [name for name, layer in module.named_modules() if isinstance(layer, layers) and layer.sparse]


def hooks_problem(owner: torch.nn.Module, modules: list[torch.nn.Module]) -> str | None:
    """Why Python forward hooks on ``owner``'s submodules (``modules``: ``owner.modules()``) would not
    work under ORT, if there are any (the owner's own hooks run around lightning_ort's forward,
    outside ORT, as in eager)."""
    from torch.nn.modules import module as torch_module

    global_hooks = torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks
    # runs before every call: the common case (no hooks) without building names
    if not global_hooks and not any(
        submodule._forward_hooks or submodule._forward_pre_hooks for submodule in modules if submodule is not owner
    ):
        return None
    hooked = []
    for name, submodule in owner.named_modules():
        hooks: list[Any] = [*submodule._forward_hooks.values(), *submodule._forward_pre_hooks.values()]
        if submodule is not owner and any(not isinstance(hook, _TRACEABLE_HOOKS) for hook in hooks):
            hooked.append(name)
    if not hooked and not global_hooks:
        return None
    where = f"submodule(s) {', '.join(hooked)}" if hooked else "every module (register_module_forward_hook)"
    return (
        f"forward hooks are registered on {where}; ORT runs the traced graph and calls no Python hook after "
        "the export, so what a hook captures would be stale. Fix: return the tensors from forward instead, or "
        "keep that module out of ORT with ORTStrategy(modules=[...])"
    )
