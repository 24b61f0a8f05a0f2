"""Fused Adam/AdamW for ORT training: torch's fused kernels on CPU, ORT's ``FusedAdam`` on CUDA."""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

_ADAM_TYPES = (torch.optim.Adam, torch.optim.AdamW)


def _uses_fused_capable_params(optimizer: torch.optim.Optimizer) -> bool:
    return all(
        param.is_floating_point() and param.device.type in ("cpu", "cuda")
        for group in optimizer.param_groups
        for param in group["params"]
    )


def fuse_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Return a fused equivalent of a torch ``Adam``/``AdamW`` (other optimizers are returned as they are).

    On CPU the optimizer object is kept and switched to torch's fused implementation, so param
    groups, hyper-parameters, state, LR schedulers and checkpoints stay as they are. On CUDA it is
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
    optimizer.defaults["fused"] = True
    optimizer.defaults["foreach"] = False
    for group in optimizer.param_groups:
        group["fused"] = True
        group["foreach"] = False
    return optimizer


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
