"""Which onnxruntime distribution is installed, and whether it fits the device asked for."""

from __future__ import annotations

import importlib.metadata

import torch

from lightning_ort.errors import ORTSetupError

TRAINING_DISTRIBUTIONS = ("onnxruntime-training", "onnxruntime-training-cpu")
CONFLICTING_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino")
SUPPORTED_ORT = "1.19."


def installed_distributions() -> dict[str, str]:
    """Installed distributions that provide the ``onnxruntime`` module, with their versions."""
    found = {}
    for name in TRAINING_DISTRIBUTIONS + CONFLICTING_DISTRIBUTIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def check_installation() -> None:
    """Raise :class:`ORTSetupError` unless exactly one ORT training build is installed."""
    found = installed_distributions()
    training = [name for name in found if name in TRAINING_DISTRIBUTIONS]
    conflicting = [name for name in found if name in CONFLICTING_DISTRIBUTIONS]
    if not training:
        extra = f" ({', '.join(conflicting)} has no training code)" if conflicting else ""
        raise ORTSetupError(
            f"No ONNX Runtime training build is installed{extra}. Fix: pip install 'lightning-ort[cpu]' "
            "(CPU) or 'lightning-ort[cuda]' (CUDA 11.8)."
        )
    if len(training) > 1 or conflicting:
        names = ", ".join(f"{name}=={found[name]}" for name in training + conflicting)
        raise ORTSetupError(
            f"Several distributions provide the `onnxruntime` module ({names}) and overwrite each other. "
            f"Fix: pip uninstall -y {' '.join(training + conflicting)} && pip install 'lightning-ort[cpu]' "
            "(or [cuda])."
        )
    version = found[training[0]]
    if not version.startswith(SUPPORTED_ORT):
        raise ORTSetupError(
            f"{training[0]}=={version} is installed; lightning_ort supports {SUPPORTED_ORT}x only. "
            f"Fix: pip install '{training[0]}==1.19.2'."
        )


def check_device(device: torch.device) -> None:
    """Raise :class:`ORTSetupError` when the installed ORT build cannot run on ``device``."""
    if device.type != "cuda":
        return
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        raise ORTSetupError(
            f"The model is on {device} but the installed ONNX Runtime ({', '.join(installed_distributions())}) "
            "has no CUDA provider. Fix: pip uninstall -y onnxruntime-training-cpu && "
            "pip install 'lightning-ort[cuda]', or train on CPU (Trainer(accelerator='cpu'))."
        )
