"""Fused Adam/AdamW for ORT training: torch's fused kernels on CPU, ORT's ``FusedAdam`` on CUDA."""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)

_ADAM_TYPES = (torch.optim.Adam, torch.optim.AdamW)
# Set on an optimizer fuse_optimizer fused: each param group's (fused, foreach) before
_UNFUSED = "_lightning_ort_unfused_flags"


def _uses_fused_capable_params(optimizer: torch.optim.Optimizer) -> bool:
    return all(
        param.is_floating_point() and param.device.type in ("cpu", "cuda")
        for group in optimizer.param_groups
        for param in group["params"]
    )


def fuse_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Return a fused equivalent of a torch ``Adam``/``AdamW`` (other optimizers are returned as they are).

    On CPU the optimizer object is kept and switched to torch's fused implementation, so param
    groups, hyper-parameters, state, LR schedulers and checkpoints stay as they are (the strategy saves
    the groups' flags as configured, and fuses them again after a resume: :func:`unfused_state`). On CUDA it is
    replaced by ORT's ``FusedAdam`` (``onnxruntime.training.optim``; needs the CUDA build of
    ORT and is untested by this project), with the same param groups and state.
    """
    if type(optimizer) not in _ADAM_TYPES:
        log.info(
            "lightning_ort: fused_optimizer leaves %s unchanged (only Adam and AdamW are fused)",
            type(optimizer).__name__,
        )
        return optimizer
    devices = {param.device.type for group in optimizer.param_groups for param in group["params"]}
    if devices == {"cuda"}:
        return _ort_fused_adam(optimizer)
    if not _uses_fused_capable_params(optimizer) or any(
        group.get("differentiable") for group in optimizer.param_groups
    ):
        log.info(
            "lightning_ort: fused_optimizer leaves %s unchanged (unsupported parameters)", type(optimizer).__name__
        )
        return optimizer
    setattr(optimizer, _UNFUSED, [(group.get("fused"), group.get("foreach")) for group in optimizer.param_groups])
    optimizer.defaults["fused"] = True
    optimizer.defaults["foreach"] = False
    _fuse_groups(optimizer)
    return optimizer


def _fuse_groups(optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:
        group["fused"] = True
        group["foreach"] = False


def unfused_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (``optimizer.state_dict()``) with the param groups' ``fused`` and ``foreach`` flags as
    ``configure_optimizers`` made them: a checkpoint resumed without ``fused_optimizer`` trains with the
    optimizer the user configured."""
    flags = getattr(optimizer, _UNFUSED, None)
    if flags is None or "param_groups" not in state:
        return state
    for group, (fused, foreach) in zip(state["param_groups"], flags, strict=False):
        group["fused"], group["foreach"] = fused, foreach
    return state


def fuse_again(optimizer: torch.optim.Optimizer) -> None:
    """After ``load_state_dict`` (which takes the flags of the checkpoint's groups), fuse a fused optimizer's
    groups again."""
    if hasattr(optimizer, _UNFUSED):
        _fuse_groups(optimizer)


def _ort_fused_adam(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    from onnxruntime.training.optim import FusedAdam

    # adam_w_mode 2 is torch's AdamW (decoupled decay); 0 is Adam's L2 penalty.
    mode = 2 if isinstance(optimizer, torch.optim.AdamW) else 0
    defaults = optimizer.defaults
    fused = FusedAdam(
        optimizer.param_groups,
        lr=defaults["lr"],
        betas=defaults["betas"],
        eps=defaults["eps"],
        weight_decay=defaults["weight_decay"],
        adam_w_mode=mode,
    )
    fused.load_state_dict(optimizer.state_dict())
    return fused
