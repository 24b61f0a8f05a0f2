"""Checks of the module itself, before ORT's export: layers whose training a graph cannot reproduce
(forward hooks are checked before every call instead, ``guard.py``)."""

from __future__ import annotations

import torch

from lightning_ort.engine.export.checks.export_check import ExportCheck, ExportContext
from lightning_ort.engine.export.user_code import user_name


def cumulative_batch_norms(module: torch.nn.Module) -> list[str]:
    """BatchNorm layers with ``momentum=None`` (a cumulative average) that track running statistics."""
    return [
        user_name(name) or type(layer).__name__
        for name, layer in module.named_modules()
        if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm)
        and layer.track_running_stats
        and layer.momentum is None
    ]


def _cumulative_batch_norm(context: ExportContext) -> str | None:
    layers = cumulative_batch_norms(context.module)
    if not layers:
        return None
    return (
        f"BatchNorm layer(s) {', '.join(layers)} use momentum=None (cumulative average), "
        "whose factor depends on num_batches_tracked and would be frozen into the ONNX graph"
    )


def sparse_embeddings(module: torch.nn.Module) -> list[str]:
    """Embedding layers with ``sparse=True``."""
    layers = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    return [name for name, layer in module.named_modules() if isinstance(layer, layers) and layer.sparse]


def _sparse_embeddings(context: ExportContext) -> str | None:
    sparse = [user_name(name) for name in sparse_embeddings(context.module)]
    if not sparse:
        return None
    return (
        f"embedding layer(s) {', '.join(sparse)} use sparse=True; ORT computes dense gradients. Fix: "
        "sparse=False, or keep them out of ORT with ORTStrategy(modules=[...])"
    )


def updating_spectral_norms(module: torch.nn.Module) -> list[str]:
    """``parametrizations.spectral_norm`` layers in training mode, which update their ``_u`` and ``_v`` in place."""
    from torch.nn.utils.parametrizations import _SpectralNorm

    return [name for name, layer in module.named_modules() if isinstance(layer, _SpectralNorm) and layer.training]


def _spectral_norms(context: ExportContext) -> str | None:
    spectral = [user_name(name) for name in updating_spectral_norms(context.module)]
    if not spectral:
        return None
    return (
        f"spectral_norm parametrization(s) {', '.join(spectral)} update their power-iteration vectors (_u, _v) "
        "in place at every training forward; an ONNX graph cannot write buffers, so they would stop changing "
        "under ORT. Fix: keep those layers out of ORT with ORTStrategy(modules=[...])"
    )


CUMULATIVE_BATCH_NORM = ExportCheck("cumulative_batch_norm", _cumulative_batch_norm, before_export=True)
SPARSE_EMBEDDINGS = ExportCheck("sparse_embeddings", _sparse_embeddings, before_export=True)
SPECTRAL_NORMS = ExportCheck("spectral_norms", _spectral_norms, before_export=True)
