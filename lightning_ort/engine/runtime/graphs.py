"""The ONNX graphs ORTModule builds, saved by ORT itself as it builds them.

ORT 1.19.2 can save five graphs per module and mode (training or inference), in build order:

- ``exported``: what ``torch.onnx.export`` produced for the module;
- ``post_processed``: after ORT's Python-side rewrites of the export;
- ``pre_grad``: after ORT's graph optimizers, before the gradient graph is built (training only);
- ``optimized``: what ORT's graph builder hands to the session: forward and gradient graph in
  training mode, the optimized forward graph in inference mode;
- ``execution``: what the session runs, after its own optimizations (fused kernels, layouts).

Parameters are graph inputs in all of them, so the files hold structure, not weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch

from lightning_ort.engine.runtime.ortmodule import _execution_managers

GraphStage = Literal["exported", "post_processed", "pre_grad", "optimized", "execution"]
GRAPH_STAGES: tuple[GraphStage, ...] = ("exported", "post_processed", "pre_grad", "optimized", "execution")
_ORT_NAMES: dict[GraphStage, str] = {
    "exported": "torch_exported",
    "post_processed": "post_processed",
    "pre_grad": "optimized_pre_grad",
    "optimized": "optimized",
    "execution": "execution_model",
}


def save_graphs(ort_module: torch.nn.Module, directory: Path, prefix: str) -> None:
    """Make ORT save every graph it builds for ``ort_module`` from now on into ``directory``.

    Graphs that were already built are not saved; call this before the module's first forward.
    """
    from onnxruntime.training.ortmodule.options import _SaveOnnxOptions

    options = _SaveOnnxOptions(True, prefix, str(directory))
    options._path = str(directory)  # ORT would let $ORTMODULE_SAVE_ONNX_PATH override the directory
    for manager in _execution_managers(ort_module):
        manager._debug_options._save_onnx_models = options  # one DebugOptions per ORTModule, shared


def saved_graph_path(directory: Path, prefix: str, stage: GraphStage, training: bool) -> Path:
    """Where ORT saves ``stage`` of the module given ``prefix`` in :func:`save_graphs`."""
    from onnxruntime.training.ortmodule._onnx_models import _get_onnx_file_name

    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
    return directory / _get_onnx_file_name(prefix, _ORT_NAMES[stage], mode)
