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
  its own copy, so the caller's tensor stayed unchanged where eager changes it;
- a tensor given alone for a fixed-size list of ints (``F.max_pool1d(h, h.shape[2])``,
  ``F.adaptive_avg_pool1d(h, h.shape[2] // 2)``): torch's argument parser reads it with ``item()``,
  neither through ``__index__`` nor with a TracerWarning, so the kernel or output size stayed the
  first batch's (a TextCNN's max over time covered part of a longer sequence).
"""

from __future__ import annotations

import contextlib
import dis
import functools
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


# Functions taking kernel, stride or output sizes as int[N], where a size read from the input (the
# length of a sequence) is the natural argument. The torch.* names are the same callables as some of F's.
_POOLING = [
    f"{kind}_pool{dims}d" for kind in ("max", "avg", "lp", "adaptive_max", "adaptive_avg") for dims in (1, 2, 3)
]
# lp_pool has no ATen operator (it is avg_pool of a power): its sizes are ``kernel_size`` and ``stride``.
_LP_POOL_SIZES = (frozenset({2, 3}), frozenset({"kernel_size", "stride"}))


@functools.cache
def _size_positions(name: str) -> tuple[frozenset[int], frozenset[str]]:
    """Positions and names of ``name``'s ``int[N]`` parameters (``F.max_pool1d`` and the other Python
    wrappers take the ATen operator's arguments in the same order)."""
    if name.startswith("lp_pool"):
        return _LP_POOL_SIZES
    positions: set[int] = set()
    names: set[str] = set()
    for schema in torch._C._jit_get_schemas_for_operator(f"aten::{name}"):
        for position, argument in enumerate(schema.arguments):
            if argument.N is not None and "List[int]" in str(argument.type):
                names.add(argument.name)
                if not argument.kwarg_only:
                    positions.add(position)
    return frozenset(positions), frozenset(names)


def _is_scalar_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 0


@contextlib.contextmanager
def size_list_reads(locate: Callable[[], str | None]) -> Iterator[list[str]]:
    """Where (``locate()`` of the caller) traced code gave a tensor alone for a pooling size
    (``F.max_pool1d(h, h.shape[2])``): torch's argument parser turns a tensor given for an ``int[N]`` into a
    number with ``item()``, which neither ``__index__`` nor a TracerWarning reveals, so the export freezes it."""
    seen: list[str] = []
    patched: list[tuple[Any, str, Any]] = []

    def checked(original: Any, positions: frozenset[int], names: frozenset[str]) -> Any:
        @functools.wraps(original)
        def pooling(*args: Any, **kwargs: Any) -> Any:
            if torch.jit.is_tracing() and (
                any(_is_scalar_tensor(args[i]) for i in positions if i < len(args))
                or any(_is_scalar_tensor(kwargs.get(name)) for name in names)
            ):
                location = locate()
                if location is not None and location not in seen:
                    seen.append(location)
            return original(*args, **kwargs)

        return pooling

    for name in _POOLING:
        positions, names = _size_positions(name)
        for namespace in (torch.nn.functional, torch):
            original = getattr(namespace, name, None)
            if original is not None:
                patched.append((namespace, name, original))
                setattr(namespace, name, checked(original, positions, names))
    try:
        yield seen
    finally:
        for namespace, name, original in patched:
            setattr(namespace, name, original)


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
