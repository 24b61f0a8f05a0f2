"""NVTX ranges that are harmless on CPU-only torch builds."""

from __future__ import annotations

import torch


def install_cpu_nvtx() -> None:
    """On a torch without CUDA, make ``torch.cuda.nvtx.range_push/pop`` no-ops instead of raising.

    ORT calls them on every step; with CUDA present the real functions are kept.
    """
    if torch.cuda.is_available() or torch.version.cuda is not None:
        return
    nvtx = torch.cuda.nvtx
    if getattr(nvtx, "_lightning_ort_noop", False):
        return
    nvtx.range_push = lambda msg: 0  # type: ignore[assignment]
    nvtx.range_pop = lambda: 0  # type: ignore[assignment]
    nvtx._lightning_ort_noop = True  # type: ignore[attr-defined]
