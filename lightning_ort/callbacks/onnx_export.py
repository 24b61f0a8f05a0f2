"""``ONNXExport``: the trained model as a deployable ONNX file, checked against PyTorch."""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import onnx
import onnxruntime
import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.callbacks import Callback
from torch.onnx import TrainingMode
from typing_extensions import override

from lightning_ort import engine
from lightning_ort.callbacks._ort import ort_bypassed
from lightning_ort.callbacks.inputs import ForwardInput, exporter_args, flatten
from lightning_ort.callbacks.snapshot import side_effects_undone
from lightning_ort.engine import ArtifactLoss, ArtifactOptimizer
from lightning_ort.errors import ONNXExportError

log = logging.getLogger(__name__)

_LOSSES = ("CrossEntropyLoss", "MSELoss", "BCEWithLogitsLoss", "L1Loss")
_OPTIMIZERS = ("AdamW", "SGD")
_NO_SAMPLE = (
    "ONNXExport needs an input sample: pass ONNXExport(input_sample=...), or set `self.example_input_array` in "
    "the LightningModule, or call `self(...)` in training_step so that its first input can be used."
)


@contextlib.contextmanager
def _plain_export(module: pl.LightningModule) -> Iterator[None]:
    """The user's own PyTorch module, standard ONNX ops, and no note that the exporter is the legacy one."""
    with (
        ort_bypassed(module),
        engine.standard_onnx_symbolics(),
        engine.attention_fast_path_off(),
        warnings.catch_warnings(),
    ):
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message="The feature will be removed", category=DeprecationWarning)
        # torch's own input checks (shapes, MHA arguments) read tensor values while tracing; user code still warns.
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning, module=r"torch\.")
        # Training-mode BatchNorm: the exported graph does not count batches (num_batches_tracked); expected here.
        warnings.filterwarnings("ignore", message="ONNX Preprocess - Removing mutation", category=UserWarning)
        yield


class ONNXExport(Callback):
    """At the end of ``fit``, export the trained model for inference as ONNX and check it.

    The LightningModule's ``forward`` is exported in eval mode with torch's TorchScript exporter
    (``dynamo=False``), in plain PyTorch (ORT unwrapped) and with standard ONNX ops only (the
    ATen/``com.microsoft`` export rules ORT registered for training are set aside). With
    ``verify=True`` the file runs in an ``onnxruntime.InferenceSession`` on the input sample and
    its outputs are compared with PyTorch's. The first dimension of every input and output is
    exported as a dynamic batch dimension. Inputs and outputs are named after ``forward``'s
    parameters (``x``, ``batch.input_ids``) and its outputs (``output``, ``output.logits``).

    Args:
        path: the ``.onnx`` file to write; by default ``<trainer.log_dir>/model.onnx``.
        input_sample: the forward input to export with (a tensor; a tuple for several positional
            arguments; a dict for keyword arguments). By default the LightningModule's
            ``example_input_array``, else the input of its first ``forward`` call in training.
        verify: run the exported file in ONNX Runtime and compare with PyTorch.
        rtol: relative tolerance of the comparison.
        atol: absolute tolerance of the comparison.
        opset_version: ONNX opset; by default torch's.
        training_artifacts_dir: if given, also write ONNX Runtime's on-device training artifacts
            there (``training_model.onnx``, ``eval_model.onnx``, ``optimizer_model.onnx``,
            ``checkpoint``, and ``base_model.onnx`` they were built from), for fine-tuning with
            ``onnxruntime.training.api`` on a device.
        training_loss: the loss the artifacts add after the model's (first) output.
        training_optimizer: the optimizer of the artifacts.
    """

    def __init__(
        self,
        path: _PATH | None = None,
        input_sample: Any = None,
        verify: bool = True,
        rtol: float = 1e-4,
        atol: float = 1e-5,
        opset_version: int | None = None,
        training_artifacts_dir: _PATH | None = None,
        training_loss: ArtifactLoss = "CrossEntropyLoss",
        training_optimizer: ArtifactOptimizer = "AdamW",
    ) -> None:
        if path is not None and Path(path).suffix != ".onnx":
            raise ValueError(f"ONNXExport(path={str(path)!r}) must name a .onnx file, e.g. path='model.onnx'.")
        if not isinstance(verify, bool):
            raise TypeError(f"ONNXExport(verify={verify!r}) must be True or False.")
        for name, value in (("rtol", rtol), ("atol", atol)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
                raise ValueError(f"ONNXExport({name}={value!r}) must be a finite float >= 0, e.g. {name}=1e-4.")
        if opset_version is not None and (
            isinstance(opset_version, bool) or not isinstance(opset_version, int) or not 7 <= opset_version <= 21
        ):
            raise ValueError(
                f"ONNXExport(opset_version={opset_version!r}) must be an int from 7 to 21 (what ONNX Runtime 1.19 "
                "runs), or None for torch's default."
            )
        if training_loss not in _LOSSES:
            raise ValueError(f"ONNXExport(training_loss={training_loss!r}) is not one of {', '.join(_LOSSES)}.")
        if training_optimizer not in _OPTIMIZERS:
            raise ValueError(f"ONNXExport(training_optimizer={training_optimizer!r}) must be 'AdamW' or 'SGD'.")
        self.path = Path(path) if path is not None else None
        self.input_sample = input_sample
        self.verify = verify
        self.rtol = float(rtol)
        self.atol = float(atol)
        self.opset_version = opset_version
        self.training_artifacts_dir = Path(training_artifacts_dir) if training_artifacts_dir is not None else None
        self.training_loss: ArtifactLoss = training_loss
        self.training_optimizer: ArtifactOptimizer = training_optimizer
        self.exported_path: Path | None = None
        self.max_abs_diff: float | None = None
        self.artifacts: list[Path] = []
        self._seen: ForwardInput | None = None
        self._hook: torch.utils.hooks.RemovableHandle | None = None

    def _sample(self, pl_module: pl.LightningModule) -> ForwardInput | None:
        if self.input_sample is not None:
            return ForwardInput.from_sample(self.input_sample)
        if pl_module.example_input_array is not None:
            return ForwardInput.from_sample(pl_module.example_input_array)
        return self._seen

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._seen = None
        if self._sample(pl_module) is None:
            self._hook = pl_module.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if module.training and self._seen is None:
            self._seen = ForwardInput(args, kwargs).detached()
            self._remove_hook()

    def _remove_hook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._sample(pl_module) is None:
            self._remove_hook()
            raise ONNXExportError(f"{_NO_SAMPLE} The first training step did not call forward.")

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._remove_hook()

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._remove_hook()
        if not trainer.is_global_zero:
            return
        sample = self._sample(pl_module)
        if sample is None:
            raise ONNXExportError(_NO_SAMPLE)
        sample = sample.detached(pl_module.device)
        log_dir = Path(trainer.log_dir or trainer.default_root_dir)
        path = self.path if self.path is not None else log_dir / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        args, input_names = sample.positional(pl_module)
        with side_effects_undone(pl_module), torch.no_grad():
            pl_module.eval()
            expected = _run(pl_module, sample)
            inputs = [leaf for value, name in zip(args, input_names, strict=True) for leaf in flatten(value, name)]
            outputs = flatten(expected, "output")
            self._export(pl_module, args, path, [name for name, _ in inputs], [name for name, _ in outputs])
        model = onnx.load(str(path))
        odd = engine.non_standard_ops(model)
        if odd:
            raise ONNXExportError(
                f"ONNXExport: {path} contains ops a plain ONNX runtime cannot run: {', '.join(odd)}. "
                "They come from custom export rules registered with torch.onnx outside lightning_ort."
            )
        self.exported_path = path
        if self.verify:
            self.max_abs_diff = self._verify(path, inputs, outputs)
        checked = (
            ""
            if self.max_abs_diff is None
            else f" (ONNX Runtime matches PyTorch, max abs diff {self.max_abs_diff:.3g})"
        )
        log.info("lightning_ort: ONNXExport wrote %s%s", path, checked)
        if self.training_artifacts_dir is not None:
            self.artifacts = self._write_artifacts(pl_module, args, inputs, outputs)
            log.info("lightning_ort: ONNXExport wrote on-device training artifacts to %s", self.training_artifacts_dir)

    def _export(
        self,
        pl_module: pl.LightningModule,
        args: tuple[Any, ...],
        path: Path,
        input_names: list[str],
        output_names: list[str],
        training: TrainingMode = TrainingMode.EVAL,
    ) -> None:
        dynamic_axes = {name: {0: "batch"} for name in input_names + output_names}
        with _plain_export(pl_module):
            torch.onnx.export(
                pl_module,
                exporter_args(args),
                str(path),
                dynamo=False,
                input_names=input_names,
                output_names=output_names,
                dynamic_axes=dynamic_axes,
                opset_version=self.opset_version,
                training=training,
                do_constant_folding=training == TrainingMode.EVAL,
            )

    def _verify(
        self, path: Path, inputs: list[tuple[str, torch.Tensor]], outputs: list[tuple[str, torch.Tensor]]
    ) -> float:
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        wanted = {graph_input.name for graph_input in session.get_inputs()}
        feeds = {name: tensor.cpu().numpy() for name, tensor in inputs if name in wanted}
        results = session.run([name for name, _ in outputs], feeds)
        worst = 0.0
        for (name, expected), result in zip(outputs, results, strict=True):
            reference = expected.detach().cpu().numpy()
            if result.shape != reference.shape or not np.allclose(result, reference, rtol=self.rtol, atol=self.atol):
                difference = np.abs(result - reference).max() if result.shape == reference.shape else float("nan")
                raise ONNXExportError(
                    f"ONNXExport: {path} computes {name} differently from PyTorch (max abs diff {difference:.3g}, "
                    f"shapes {result.shape} vs {reference.shape}, rtol={self.rtol:g}, atol={self.atol:g}). "
                    "Check the model for code that behaves differently when traced."
                )
            worst = max(worst, float(np.abs(result - reference).max()) if reference.size else 0.0)
        return worst

    def _write_artifacts(
        self,
        pl_module: pl.LightningModule,
        args: tuple[Any, ...],
        inputs: list[tuple[str, torch.Tensor]],
        outputs: list[tuple[str, torch.Tensor]],
    ) -> list[Path]:
        assert self.training_artifacts_dir is not None
        directory = self.training_artifacts_dir
        directory.mkdir(parents=True, exist_ok=True)
        base = directory / "base_model.onnx"
        # Tracing runs forward in training mode: BatchNorm statistics and random states are put back after it.
        with side_effects_undone(pl_module), torch.no_grad():
            pl_module.training = True  # submodules keep their training-time modes (frozen layers stay frozen)
            self._export(
                pl_module,
                args,
                base,
                [name for name, _ in inputs],
                [name for name, _ in outputs],
                training=TrainingMode.PRESERVE,
            )
        model = onnx.load(str(base))
        initializers = {initializer.name for initializer in model.graph.initializer}
        trainable = [name for name, parameter in pl_module.named_parameters() if parameter.requires_grad]
        frozen = [name for name, parameter in pl_module.named_parameters() if not parameter.requires_grad]
        missing = [name for name in trainable + frozen if name not in initializers]
        if missing:
            raise ONNXExportError(
                f"ONNXExport: parameter(s) {', '.join(missing)} are not named initializers of the training export, "
                "so ORT's training artifacts cannot train them."
            )
        loss_inputs = [outputs[0][0]] if len(outputs) > 1 else None
        files = engine.generate_training_artifacts(
            model, trainable, frozen, self.training_loss, self.training_optimizer, directory, loss_inputs
        )
        if self.verify:
            engine.check_training_artifacts(directory)
        return files


def _run(pl_module: pl.LightningModule, sample: ForwardInput) -> Any:
    """``forward`` on the sample in PyTorch, computed the way the export traces it."""
    with ort_bypassed(pl_module), engine.attention_fast_path_off():
        return pl_module(*sample.args, **sample.kwargs)
