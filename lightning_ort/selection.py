"""Which parts of a LightningModule become ORT graphs."""

from __future__ import annotations

import lightning.pytorch as pl
import torch

FORWARD = "forward"


def _overrides_forward(model: pl.LightningModule) -> bool:
    return type(model).forward is not pl.LightningModule.forward


def _has_forward(module: torch.nn.Module) -> bool:
    """False for containers only called through their items (``nn.ModuleList``, ``nn.ModuleDict``)."""
    return type(module).forward is not torch.nn.Module.forward


def trainable_children(model: torch.nn.Module, prefix: str = "") -> list[str]:
    """Children with a parameter that requires grad, named ``prefix + name``; a container's items in its place."""
    names = []
    for name, child in model.named_children():
        if not any(parameter.requires_grad for parameter in child.parameters()):
            continue
        if _has_forward(child):
            names.append(prefix + name)
        else:
            names += trainable_children(child, f"{prefix}{name}.")
    return names


def _callable_parts(model: torch.nn.Module, name: str) -> list[str]:
    """``name``, or the items of the container it names (recursively), which are what gets called."""
    module = model.get_submodule(name)
    if _has_forward(module):
        return [name]
    return [part for child in dict(module.named_children()) for part in _callable_parts(model, f"{name}.{child}")]


def select_modules(model: pl.LightningModule, requested: list[str] | None, prefer_forward: bool = True) -> list[str]:
    """Names of what to wrap: ``requested`` (validated), else the LightningModule's forward, else trainable children.

    A container that is never called itself (``nn.ModuleList``, ``nn.ModuleDict``) stands for its items.

    Raises:
        ValueError: a requested name is not a submodule, or names overlap (one inside another).
    """
    if requested is None:
        if prefer_forward and _overrides_forward(model):
            return [FORWARD]
        return trainable_children(model)
    if FORWARD in requested and len(requested) > 1:
        raise ValueError(
            f"ORTStrategy(modules={requested!r}): 'forward' already contains every submodule; name it alone."
        )
    if FORWARD in requested and not _overrides_forward(model):
        raise ValueError(f"ORTStrategy(modules=['forward']): {type(model).__name__} does not define forward().")
    available = dict(model.named_modules())
    for name in requested:
        if name != FORWARD and (name == "" or name not in available):
            children = ", ".join(name for name, _ in model.named_children()) or "none"
            raise ValueError(
                f"ORTStrategy(modules=[...]): {type(model).__name__} has no submodule {name!r} "
                f"(its children: {children})."
            )
    for outer in requested:
        for inner in requested:
            if outer != inner and outer != FORWARD and inner.startswith(outer + "."):
                raise ValueError(f"ORTStrategy(modules=[...]): {inner!r} is inside {outer!r}; name only one of them.")
    return [part for name in requested for part in ([name] if name == FORWARD else _callable_parts(model, name))]
