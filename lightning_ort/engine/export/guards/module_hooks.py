"""Python hooks on the submodules of a module ORT runs, checked before every call.

Forward hooks and pre-hooks on submodules run during the export only, so features captured by a hook
would be stale under ORT, and backward hooks would never run (ORT computes the submodules' gradients
inside its graph): :func:`hooks_problem` says so. Weight normalisation and pruning hooks, which compute a
weight from parameters before each forward, become part of the graph and are fine
(:func:`hooked_weight_names`, :func:`refresh_hooked_weights`); Lightning's model-summary hooks make one
call run in PyTorch (:func:`summary_hooks`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.utils import prune
from torch.nn.utils.weight_norm import WeightNorm

# Hooks that compute a weight from parameters before each forward: the trace records the computation.
_TRACEABLE_HOOKS = (WeightNorm, prune.BasePruningMethod)
_SUMMARY_MODULE = "lightning.pytorch.utilities.model_summary"


def hooked_weight_names(module: torch.nn.Module) -> set[str]:
    """The attributes ``module``'s weight normalisation and pruning hooks set before each forward (``weight``
    from ``weight_orig`` and the mask): the trace computes them inside the graph."""
    names = set()
    for hook in module._forward_pre_hooks.values():
        if isinstance(hook, prune.BasePruningMethod):
            names.add(hook._tensor_name)
        elif isinstance(hook, WeightNorm):
            names.add(hook.name)
    return names


def refresh_hooked_weights(modules: list[torch.nn.Module]) -> None:
    """Set the attributes weight normalisation and pruning hooks compute, as the forward ORT ran instead of
    PyTorch would have: code outside forward reads them (the next round of ``ModelPruning`` ranks the weights
    it finds there), and they would otherwise stay as the export left them."""
    with torch.no_grad():
        for module in modules:
            for hook in list(module._forward_pre_hooks.values()):
                if isinstance(hook, _TRACEABLE_HOOKS):
                    hook(module, ())


def _forward_hooks(module: torch.nn.Module) -> list[Any]:
    return [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]


def _has_backward_hooks(module: torch.nn.Module) -> bool:
    return bool(module._backward_hooks or module._backward_pre_hooks)


def summary_hooks(modules: list[torch.nn.Module]) -> bool:
    """Whether Lightning's model summary hooks the modules (its ``example_input_array`` call): a call to run
    in PyTorch, for the summary's sizes, leaving ORT's graphs to the calls after it."""
    return any(
        getattr(hook, "__module__", "").startswith(_SUMMARY_MODULE)
        for module in modules
        if module._forward_hooks
        for hook in module._forward_hooks.values()
    )


def hooks_problem(owner: torch.nn.Module, modules: list[torch.nn.Module]) -> str | None:
    """Why Python hooks on ``owner``'s submodules (``modules``: ``owner.modules()``) would not work
    under ORT, if there are any (the owner's own hooks run around lightning_ort's forward, outside
    ORT, as in eager): forward hooks run during the export only, backward hooks never, since ORT
    computes the submodules' gradients inside its graph."""
    from torch.nn.modules import module as torch_module

    global_forward = torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks
    global_backward = torch_module._global_backward_hooks or torch_module._global_backward_pre_hooks
    # runs before every call: the common case (no hooks) without building names
    if (
        not global_forward
        and not global_backward
        and not any(
            submodule._forward_hooks or submodule._forward_pre_hooks or _has_backward_hooks(submodule)
            for submodule in modules
            if submodule is not owner
        )
    ):
        return None
    forward, backward = [], []
    for name, submodule in owner.named_modules():
        if submodule is owner:
            continue
        if any(not isinstance(hook, _TRACEABLE_HOOKS) for hook in _forward_hooks(submodule)):
            forward.append(name)
        if _has_backward_hooks(submodule):
            backward.append(name)
    fix = "Fix: return the tensors from forward instead, or keep that module out of ORT with ORTStrategy(modules=[...])"
    if backward or global_backward:
        where = (
            f"submodule(s) {', '.join(backward)}" if backward else "every module (register_module_full_backward_hook)"
        )
        return (
            f"backward hooks are registered on {where}; ORT computes the gradients of its graph in one piece "
            f"and calls no Python hook of a submodule, so the hooks would never see or change them. {fix}"
        )
    if not forward and not global_forward:
        return None
    where = f"submodule(s) {', '.join(forward)}" if forward else "every module (register_module_forward_hook)"
    return (
        f"forward hooks are registered on {where}; ORT runs the traced graph and calls no Python hook after "
        f"the export, so what a hook captures would be stale. {fix}"
    )
