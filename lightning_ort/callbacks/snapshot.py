"""Run an extra training step's forward without leaving a trace on the training run."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.seed import _collect_rng_states, _set_rng_states
from torchmetrics import Metric

# torchmetrics' bookkeeping besides the declared states (update count, cached compute/forward results).
_METRIC_BOOKKEEPING = ("_update_count", "_computed", "_forward_cache")


def rng_states() -> dict[str, Any]:
    """The global random states of torch (CPU and CUDA), numpy and Python."""
    return _collect_rng_states(include_cuda=torch.cuda.is_available())


def _metric_state(metric: Metric) -> dict[str, Any]:
    state = {name: copy.deepcopy(value) for name, value in metric.metric_state.items()}
    for name in _METRIC_BOOKKEEPING:
        if hasattr(metric, name):
            state[name] = copy.copy(getattr(metric, name))
    return state


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


@contextlib.contextmanager
def side_effects_undone(pl_module: pl.LightningModule, replay_rng: dict[str, Any] | None = None) -> Iterator[None]:
    """Inside the block ``pl_module`` may run a training step's forward; afterwards nothing shows it did.

    Parameters and buffers (BatchNorm statistics and counters), torchmetrics states, module
    train/eval modes and the global random states are restored; ``self.log`` and
    ``self.log_dict`` do nothing inside. With ``replay_rng`` the block starts from those random
    states, so it draws the same random numbers as the step that started from them.
    """
    tensors = [(tensor, tensor.detach().clone()) for tensor in (*pl_module.parameters(), *pl_module.buffers())]
    metrics = [(metric, _metric_state(metric)) for metric in pl_module.modules() if isinstance(metric, Metric)]
    modes = [(module, module.training) for module in pl_module.modules()]
    rng = rng_states()
    shadowed = [name for name in ("log", "log_dict") if name not in pl_module.__dict__]
    for name in shadowed:
        object.__setattr__(pl_module, name, _noop)
    if replay_rng is not None:
        _set_rng_states(replay_rng)
    try:
        yield
    finally:
        for name in shadowed:
            object.__delattr__(pl_module, name)
        with torch.no_grad():
            for tensor, saved in tensors:
                tensor.copy_(saved)
        for metric, state in metrics:
            for name, value in state.items():
                setattr(metric, name, value)
        for module, training in modes:
            module.training = training
        _set_rng_states(rng)
