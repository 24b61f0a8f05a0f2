"""Where the user's code is, seen from inside ORT's export: the user's modules under ORT's flattened module,
and the innermost frame of a call outside torch, lightning_ort and ORT (the line a refusal names)."""

from __future__ import annotations

import os
import sys

import torch

from lightning_ort.engine.export.traced_calls import ORT_DIR

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_ENGINE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # lightning_ort/engine/


def user_frame() -> str | None:
    """``file:line`` of the innermost caller outside torch, this package and ORT, if any."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith((_TORCH_DIR, _ENGINE_DIR, ORT_DIR)) and not filename.startswith("<frozen"):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def adapter_of(module: torch.nn.Module) -> torch.nn.Module:
    """The module ORT's flattened ``module`` wraps (lightning_ort's ForwardAdapter)."""
    return getattr(module, "_original_module", module)


def user_modules(module: torch.nn.Module) -> dict[int, tuple[torch.nn.Module, str]]:
    """The user's modules under ORT's flattened ``module`` (the adapter's owner included), by id, with
    the names the user knows them by."""
    modules = {
        id(submodule): (submodule, name.removeprefix("_original_module").lstrip(".") or "self")
        for name, submodule in module.named_modules()
        if submodule is not module
    }
    owner = getattr(adapter_of(module), "_owner", None)
    if isinstance(owner, torch.nn.Module):
        modules[id(owner)] = (owner, "self")
    return modules


def user_name(name: str) -> str:
    """A name under ORT's flattened module (which holds the user's module as ``_original_module``) as the user
    knows it."""
    return name.removeprefix("_original_module.")
