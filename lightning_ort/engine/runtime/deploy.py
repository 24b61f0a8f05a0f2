"""ONNX files for use outside the training run: plain inference models and on-device training artifacts."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import onnx

from lightning_ort.engine.bootstrap.loader import is_loaded
from lightning_ort.engine.runtime.logs import NATIVE_LOGGER, NativeLogCapture

ArtifactLoss = Literal["CrossEntropyLoss", "MSELoss", "BCEWithLogitsLoss", "L1Loss"]
ArtifactOptimizer = Literal["AdamW", "SGD"]
# ORT 1.19.2 loads models up to IR version 10; newer `onnx` packages write their own, higher one.
MAX_IR_VERSION = 10


@contextlib.contextmanager
def standard_onnx_symbolics() -> Iterator[None]:
    """Inside the block ``torch.onnx.export`` emits standard ONNX ops only.

    Creating an ORTModule registers ORT's export rules with torch globally (BatchNorm and max
    pooling as ``org.pytorch.aten::ATen`` nodes, cross entropy as ``com.microsoft`` ops, ...); a
    model exported afterwards would need ORT's training build and torch to run. The block
    removes those rules and puts them back afterwards.
    """
    removed = remove_training_symbolics()
    try:
        yield
    finally:
        for group, opset, function in removed:
            group.add_custom(function, opset)


def remove_training_symbolics() -> list[tuple[Any, int, Any]]:
    """Remove ORT's export rules from torch (see :func:`standard_onnx_symbolics`), so that a later
    ``torch.onnx.export`` or ``LightningModule.to_onnx`` writes standard ONNX; return what was removed.
    The next ORTModule registers them again."""
    if not is_loaded():
        return []
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry
    from torch.onnx._internal.torchscript_exporter import registration

    removed: list[tuple[Any, int, Any]] = []
    for name in CustomOpSymbolicRegistry._SYMBOLICS:
        group = registration.registry.get_function_group(f"aten{name}" if name.startswith("::") else name)
        if group is None:
            continue
        for opset, function in list(group._functions._overrides.items()):
            group.remove_custom(opset)
            removed.append((group, opset, function))
    return removed


def non_standard_ops(model: onnx.ModelProto) -> list[str]:
    """``domain::op_type`` of the nodes a plain ONNX runtime cannot be expected to run."""
    standard = {"", "ai.onnx", "ai.onnx.ml"}
    return sorted({f"{node.domain}::{node.op_type}" for node in model.graph.node if node.domain not in standard})


def _eval_batch_norms_fixed(model: onnx.ModelProto) -> bool:
    """onnxblock's eval model keeps the running-statistics outputs of training-mode BatchNormalization
    after switching it to inference mode, which ONNX forbids; they are unused, so they go."""
    used = {name for node in model.graph.node for name in node.input} | {output.name for output in model.graph.output}
    changed = False
    for node in model.graph.node:
        training = any(attribute.name == "training_mode" and attribute.i for attribute in node.attribute)
        extra = list(node.output)[1:]
        if node.op_type == "BatchNormalization" and not training and extra and not set(extra) & used:
            del node.output[1:]
            changed = True
    return changed


def _make_loadable(path: Path) -> None:
    model = onnx.load(str(path), load_external_data=False)
    changed = _eval_batch_norms_fixed(model)
    if model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION
        changed = True
    if changed:
        onnx.save(model, str(path))


def generate_training_artifacts(
    model: onnx.ModelProto,
    trainable: list[str],
    frozen: list[str],
    loss: ArtifactLoss,
    optimizer: ArtifactOptimizer,
    directory: Path,
    loss_input_names: list[str] | None = None,
) -> list[Path]:
    """Write ORT's on-device training artifacts for ``model`` into ``directory``; return the files.

    ``model`` must be exported in training mode with its parameters as initializers.
    """
    from onnxruntime.training import artifacts

    directory.mkdir(parents=True, exist_ok=True)
    # The gradient builder logs every graph transformer it applies to stderr at INFO severity.
    native = NativeLogCapture(logging.getLogger(NATIVE_LOGGER))
    native.start(logging.WARNING)
    try:
        artifacts.generate_artifacts(
            model,
            requires_grad=trainable,
            frozen_params=frozen,
            loss=artifacts.LossType[loss],
            optimizer=artifacts.OptimType[optimizer],
            artifact_directory=directory,
            loss_input_names=loss_input_names,
        )
    finally:
        native.close()
    files = sorted(directory.iterdir())
    for path in files:
        if path.suffix == ".onnx":
            _make_loadable(path)
    return files


def check_training_artifacts(directory: Path) -> None:
    """Load the artifacts as ``onnxruntime.training.api`` would on a device; raise if they do not load."""
    from onnxruntime.training import api

    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"))
    api.Optimizer(str(directory / "optimizer_model.onnx"), module)
