"""Normalization layers with running statistics inside ``torch.utils.checkpoint(use_reentrant=False)``.

Eager PyTorch runs a non-reentrant checkpoint's function again in backward to recompute what it did
not keep, so a BatchNorm in training mode inside it updates its running statistics twice per step
(``num_batches_tracked`` grows by 2). ORT trains the checkpointed computation as part of its graph,
without recomputation: once. The statistics, and every evaluation after training, differed silently
(by 0.116 on a small network's eval output after two steps). Such layers are found while the export
runs the function, and the module is refused with the reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.checkpoint
from torch.nn.modules.batchnorm import _NormBase

from lightning_ort.engine.export.checks.export_check import ExportCheck, ExportContext, Recorder

# The generator that runs a non-reentrant checkpoint's function: torch >= 2.14's checkpoint() calls the
# _impl directly (the old name only forwards to it)
_GENERATOR = next(
    name
    for name in ("_checkpoint_without_reentrant_generator_impl", "_checkpoint_without_reentrant_generator")
    if hasattr(torch.utils.checkpoint, name)
)


@contextlib.contextmanager
def checkpointed_running_statistics(root: torch.nn.Module) -> Iterator[list[str]]:
    """Record the names (in ``root``) of normalization layers that update running statistics while a
    non-reentrant checkpoint's function runs inside the block."""
    names = {id(module): name for name, module in root.named_modules()}
    found: list[str] = []
    original = getattr(torch.utils.checkpoint, _GENERATOR)

    def record(module: torch.nn.Module, args: Any) -> None:
        updates = isinstance(module, _NormBase) and module.training and module.track_running_stats
        name = names.get(id(module), type(module).__name__)
        if updates and name not in found:
            found.append(name)

    def watched(*args: Any, **kwargs: Any) -> Iterator[Any]:
        handle = torch.nn.modules.module.register_module_forward_pre_hook(record)
        try:
            return (yield from original(*args, **kwargs))
        finally:
            handle.remove()

    setattr(torch.utils.checkpoint, _GENERATOR, watched)
    try:
        yield found
    finally:
        setattr(torch.utils.checkpoint, _GENERATOR, original)


CHECKPOINTED_NORMS = Recorder("checkpointed_norms", lambda context: checkpointed_running_statistics(context.module))


def _checkpointed_norms(context: ExportContext) -> str | None:
    norms = context[CHECKPOINTED_NORMS]
    if not norms:
        return None
    return (
        f"normalization layer(s) {', '.join(norms)} update running statistics inside "
        "torch.utils.checkpoint(use_reentrant=False); eager PyTorch updates them twice per step (again when it "
        "recomputes the checkpointed function in backward), ORT's graph once. Fix: keep BatchNorm out of the "
        "checkpointed function, or keep that module out of ORT with ORTStrategy(modules=[...])"
    )


CHECKPOINTED_RUNNING_STATISTICS = ExportCheck("checkpointed_norms", _checkpointed_norms, reads=(CHECKPOINTED_NORMS,))
