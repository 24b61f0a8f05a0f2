"""Checks on the buffers the traced forward writes: an ONNX graph cannot write buffers, so any but the
BatchNorm statistics lightning_ort keeps in step with eager (``ops/kernels/batchnorm.py``) would stop
changing under ORT. The export's own forward runs leave every buffer as it was."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from lightning_ort.engine.export.checks.export_check import ExportCheck, ExportContext, Recorder
from lightning_ort.engine.export.tracing_state import untraced
from lightning_ort.engine.export.user_code import user_name
from lightning_ort.engine.ops.kernels.batchnorm import record_calls_per_forward


def _kept_batch_norm_buffers(module: torch.nn.Module) -> set[int]:
    """Ids of the BatchNorm buffers lightning_ort keeps in step with eager."""
    return {
        id(buffer)
        for layer in module.modules()
        if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm) and layer.track_running_stats
        for buffer in layer.buffers(recurse=False)
    }


def _user_buffers(module: torch.nn.Module, buffers: list[tuple[str, torch.Tensor]]) -> list[str]:
    """The names, as the user knows them, of ``buffers`` other than the BatchNorm statistics lightning_ort
    keeps in step with eager."""
    handled = _kept_batch_norm_buffers(module)
    return [user_name(name) for name, buffer in buffers if id(buffer) not in handled]


@contextlib.contextmanager
def _preserved_buffers(module: torch.nn.Module) -> Iterator[tuple[list[str], list[str], Callable[[], list[str]]]]:
    """Undo buffer updates made by the forward runs the export does (in place or by assigning a new
    tensor); list the buffers they changed in place, and those they replaced. The third item names the
    buffers written in place so far, for an export that failed before the block ends.

    BatchNorm statistics are updated correctly inside the ORT graph (see ``batchnorm.py``); any
    other buffer a forward writes in place would silently stop being updated under ORT.
    """
    saved = [(name, buffer, buffer.detach().clone()) for name, buffer in module.named_buffers()]
    # Autograd checks the version of tensors it saved: BatchNorm saves its running statistics, so an eager
    # call of a submodule before this export (`self.encoder(x)`, then `self(x)`) failed in backward.
    versions = [buffer._version for _, buffer, _ in saved]
    changed: list[str] = []
    replaced: list[str] = []

    def written() -> list[str]:
        pairs = zip(saved, versions, strict=True)
        return _user_buffers(module, [(name, buffer) for (name, buffer, _), old in pairs if buffer._version != old])

    try:
        yield changed, replaced, written
    finally:
        current = dict(module.named_buffers())
        with torch.no_grad():
            for name, buffer, value in saved:
                if current.get(name) is not buffer:  # assigned a new tensor (self.ema = ...): put the old one back
                    owner_name, _, attribute = name.rpartition(".")
                    module.get_submodule(owner_name)._buffers[attribute] = buffer
                    replaced.append(user_name(name))
                elif not torch.equal(buffer, value):
                    changed.append(name)
                buffer.copy_(value)
        torch._C._autograd._unsafe_set_version_counter([buffer for _, buffer, _ in saved], versions)
        by_name = dict(module.named_buffers())
        changed[:] = _user_buffers(module, [(name, by_name[name]) for name in changed])


BUFFERS = Recorder("buffers", lambda context: _preserved_buffers(context.module))


def _buffer_updates(mutated: list[str]) -> str | None:
    if not mutated:
        return None
    return (
        f"its forward updates buffer(s) {', '.join(mutated)} in place; an ONNX graph cannot write to "
        "buffers, so they would silently stop changing under ORT"
    )


def _replaced(context: ExportContext) -> str | None:
    _, replaced, _ = context[BUFFERS]
    if not replaced:
        return None
    return (
        f"its forward assigns new tensors to buffer(s) {', '.join(replaced)} (self.buffer = ...); an ONNX graph "
        "cannot write to buffers, so they would silently stop changing under ORT"
    )


@contextlib.contextmanager
def _traced_batch_norm_calls(context: ExportContext) -> Iterator[None]:
    """Record how often the traced forward ran each BatchNorm layer, from how far it advanced the layer's
    ``num_batches_tracked`` (ORT's graph cannot advance it; batchnorm.py does, per call). Only the trace's
    forward counts: ORT runs a module it cannot deep-copy (a pruned one) once more for its output schema."""
    module = context.module
    layers = [
        layer
        for layer in module.modules()
        if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm) and layer.num_batches_tracked is not None
    ]
    starts: dict[torch.nn.Module, int] = {}
    counts: dict[torch.nn.Module, int] = {}

    def batches() -> dict[torch.nn.Module, int]:
        with untraced():  # read as numbers, not trace nodes
            return {layer: int(layer.num_batches_tracked) for layer in layers}

    def started(traced: torch.nn.Module, args: Any) -> None:
        if torch.jit.is_tracing():
            starts.update(batches())

    def ended(traced: torch.nn.Module, args: Any, output: Any) -> None:
        if torch.jit.is_tracing():
            counts.update((layer, count - starts[layer]) for layer, count in batches().items())

    handles = [module.register_forward_pre_hook(started), module.register_forward_hook(ended)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        if module.training and context.exported.traced:  # a cached export's counts come from its trace record
            for layer in layers:
                record_calls_per_forward(layer, counts.get(layer, 0))


# not a check: what the runtime's BatchNorm kernels need to advance num_batches_tracked as eager does
BATCH_NORM_CALLS = Recorder("batch_norm_calls", _traced_batch_norm_calls)
# an in-place update (buffer.copy_(...)) is also what torch fails to export: then it is the refusal
BUFFER_UPDATES = ExportCheck(
    "buffer_updates",
    lambda context: _buffer_updates(context[BUFFERS][0]),
    failure=lambda context, error: _buffer_updates(context[BUFFERS][2]()),
    reads=(BUFFERS,),
)
REPLACED_BUFFERS = ExportCheck("replaced_buffers", _replaced, reads=(BUFFERS,))
