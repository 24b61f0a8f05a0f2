"""The CPU memory arena of the torch kernels inside ORT's graphs (``csrc/memory_arena.cc``).

ORT's own kernels allocate from ORT's arena, which keeps memory from one step to the next. The
torch kernels lightning_ort runs inside the same graphs (ATen nodes: op_rewrites, channels_last)
allocate through torch's CPU allocator, that is malloc, which gives large blocks back to the system
when a step frees them and page-faults them in again in the next step. While ORT runs a graph of a
module wrapped with ``memory_arena=True``, those allocations come from lightning_ort's arena instead
(see :func:`arena_scope`, used around ORT's graph runs by ``session_hooks.py``, and around whole steps by
the strategies on the CPU).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import NamedTuple

import torch

from lightning_ort.engine.bootstrap.extensions import load_aten_ops

log = logging.getLogger(__name__)
_installed = False


class ArenaStats(NamedTuple):
    """Byte counts and block counts of the arena, process-wide."""

    in_use_bytes: int
    reserved_bytes: int
    peak_in_use_bytes: int
    reuses: int
    fresh_blocks: int


def install() -> bool:
    """Put the arena in front of torch's CPU allocator (once per process); whether it serves allocations.

    It serves nothing if another library installed a CPU allocator of higher priority; training is
    then unchanged, only slower.
    """
    global _installed
    load_aten_ops()
    installed = bool(torch.ops.lightning_ort.memory_arena_install())
    _installed = True
    if not installed:
        log.warning(
            "lightning_ort: another CPU allocator takes precedence over lightning_ort's memory arena; "
            "torch kernels inside ORT's graphs allocate through it (same results, possibly slower). "
            "Pass memory_arena=False to silence this."
        )
    return installed


@contextlib.contextmanager
def arena_scope(enabled: bool) -> Iterator[None]:
    """While inside, if ``enabled``, this thread's CPU allocations of 64 KiB and more use the arena."""
    if not (enabled and (_installed or install())):
        yield
        return
    previous = torch.ops.lightning_ort.memory_arena_scope(True)
    try:
        yield
    finally:
        torch.ops.lightning_ort.memory_arena_scope(previous)


def release() -> None:
    """Give the arena's free blocks back to the system (blocks tensors still hold stay in it)."""
    if _installed:
        torch.ops.lightning_ort.memory_arena_release()


def stats() -> ArenaStats:
    """The arena's counters (zeros until a module with ``memory_arena=True`` has run)."""
    load_aten_ops()
    return ArenaStats(*torch.ops.lightning_ort.memory_arena_stats())
