"""Mixed precision for models that run in ONNX Runtime."""

from __future__ import annotations

from typing import Literal

import torch
from lightning.pytorch.plugins.precision import MixedPrecision, Precision

SUPPORTED_PRECISIONS = ("32-true", "16-mixed", "bf16-mixed")


class ORTPrecision(MixedPrecision):
    """Automatic mixed precision around ORT graphs (``precision="16-mixed"`` or ``"bf16-mixed"``).

    ``ORTStrategy`` picks it for mixed precision. ``torch.autocast`` is active while the steps run,
    so ORT exports and runs the wrapped modules under autocast: their graphs contain the same casts
    as eager autocast. fp16 uses a ``GradScaler`` (unscale before clipping, steps with inf/nan
    gradients skipped), as Lightning's :class:`~lightning.pytorch.plugins.precision.MixedPrecision`.
    ORT's CPU build has no bfloat16 kernels for matrix products: on CPU such modules train in
    PyTorch after one warning that names the missing kernel.
    """

    def __init__(
        self,
        precision: Literal["16-mixed", "bf16-mixed"],
        device: str,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        super().__init__(precision, device, scaler)


def ort_precision(plugin: Precision) -> Precision:
    """The precision plugin ORTStrategy uses for ``plugin``, or a ``ValueError`` for unsupported ones."""
    if type(plugin) is Precision or isinstance(plugin, ORTPrecision):
        return plugin
    if type(plugin) is MixedPrecision:
        return ORTPrecision(plugin.precision, plugin.device, plugin.scaler)
    name = getattr(plugin, "precision", type(plugin).__name__)
    raise ValueError(
        f"ORTStrategy does not support precision={name!r} ({type(plugin).__name__}). "
        f"Use one of {', '.join(SUPPORTED_PRECISIONS)}, or another strategy for this precision."
    )
