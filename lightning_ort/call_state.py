"""What a guard compares between calls of a wrapped module: the structure of its inputs, the autocast state,
and the submodules, parameters and buffers ORT's graph was built from."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils import _pytree


def input_structure(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """What of a call's inputs ORT exports or builds its gradient graph again for: their nesting, each
    tensor's dtype, rank, device and ``requires_grad``, each bool's value (Python numbers are fed as
    tensors), the type of anything else."""
    leaves, spec = _pytree.tree_flatten((args, kwargs))
    return spec, tuple(
        (leaf.dtype, leaf.dim(), leaf.device, leaf.requires_grad)
        if isinstance(leaf, torch.Tensor)
        else leaf
        if leaf is None or isinstance(leaf, (bool, str))
        else type(leaf)
        for leaf in leaves
    )


def autocast_state() -> tuple[bool, torch.dtype]:
    """Whether autocast is on (CUDA's, else the CPU's), and its dtype."""
    for device in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device):
            return True, torch.get_autocast_dtype(device)
    return False, torch.float32


def _module_tensors(modules: list[torch.nn.Module]) -> Iterator[torch.Tensor | None]:
    for module in modules:
        yield from module._parameters.values()
        yield from module._buffers.values()


def _code(modules: list[torch.nn.Module]) -> Iterator[int]:
    """The submodules' classes and the ``forward`` set on an instance, if any: the code the export traced."""
    for module in modules:
        yield id(type(module))
        yield id(module.__dict__.get("forward"))


def identities(modules: list[torch.nn.Module]) -> tuple[int, ...]:
    """The objects ORT's graph reads: the submodules, their code, parameters and buffers."""
    return (*map(id, modules), *_code(modules), *map(id, _module_tensors(modules)))


def layout(modules: list[torch.nn.Module]) -> tuple[Any, ...]:
    """What ORT's graph depends on of the submodules (their code too), parameters and buffers (not the
    tensor objects)."""
    return (
        *map(id, modules),
        *_code(modules),
        *((None if value is None else (value.shape, value.dtype, value.device)) for value in _module_tensors(modules)),
    )


def own_forward(owner: torch.nn.Module) -> Any:
    """``owner``'s class ``forward`` bound to it (what a guard in front of it stands in for)."""
    return type(owner).forward.__get__(owner)


def trainable_parameters(module: torch.nn.Module) -> int:
    """Elements of the module's parameters that require grad (a parameter shared by two submodules counts once)."""
    return sum(parameter.numel() for parameter in module.parameters() if parameter.requires_grad)
