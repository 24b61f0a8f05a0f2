"""``ONNXGraphDump``: keep the ONNX graphs ORT builds during a run, with a readable summary."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import onnxruntime
import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_ort import engine
from lightning_ort.callbacks._ort import ORTRunStrategy, ort_strategy, reports_by_name
from lightning_ort.callbacks.graph_summary import GraphSummary
from lightning_ort.engine import GRAPH_STAGES, GraphStage

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary.txt"
_STAGING = ".ort-staging"
_MODES = {True: "training", False: "inference"}


def _prefix(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


class ONNXGraphDump(Callback):
    """Save the ONNX graphs ORT builds for each wrapped module and mode, and a summary beside them.

    Files are named ``<module>.<mode>.<n>_<stage>.onnx`` (for example
    ``forward.training.4_optimized.onnx``), open in Netron and load with ``onnx.load``.
    ``summary.txt`` lists, per graph, its node count, most frequent op types, the ops ORT runs
    through torch (ATen fallback) and the fused kernels ORT created; for a module or mode that ORT
    gave up on it says so and why. Parameters are graph inputs: the files hold structure, not weights.

    Args:
        dirpath: directory for the files; by default ``<trainer.log_dir>/onnx``.
        stages: which of ORT's graphs to keep, in build order: ``"exported"`` (torch's export),
            ``"post_processed"`` (after ORT's Python rewrites), ``"pre_grad"`` (optimized, before the
            gradient graph; training only), ``"optimized"`` (forward and gradient graph in training,
            optimized forward in inference), ``"execution"`` (what the session runs, after its own
            fusions). All by default.
    """

    def __init__(self, dirpath: _PATH | None = None, stages: Sequence[GraphStage] = GRAPH_STAGES) -> None:
        if isinstance(stages, str) or not isinstance(stages, Sequence):
            raise TypeError(f"ONNXGraphDump(stages={stages!r}) must be a list of stages, e.g. stages=['optimized'].")
        unknown = [stage for stage in stages if stage not in GRAPH_STAGES]
        if unknown or not stages:
            problem = f"unknown stage(s) {unknown!r}" if unknown else "no stage"
            raise ValueError(
                f"ONNXGraphDump(stages={list(stages)!r}): {problem}; choose from {', '.join(GRAPH_STAGES)}."
            )
        self.dirpath = Path(dirpath) if dirpath is not None else None
        self.stages: tuple[GraphStage, ...] = tuple(stages)
        self.graphs: dict[tuple[str, str], list[GraphSummary]] = {}
        self.notes: dict[tuple[str, str], str] = {}
        self._directory: Path | None = None
        self._strategy: ORTRunStrategy | None = None
        self._configured: dict[str, torch.nn.Module] = {}

    @property
    def directory(self) -> Path | None:
        """Where the graphs of the current or last run went."""
        return self._directory

    @property
    def summary_path(self) -> Path | None:
        """The summary file of the current or last run."""
        return None if self._directory is None else self._directory / SUMMARY_FILE

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._strategy = ort_strategy(trainer, "ONNXGraphDump")
        self._configured = {}
        if self._strategy is None:
            return
        root = self.dirpath if self.dirpath is not None else Path(trainer.log_dir or trainer.default_root_dir) / "onnx"
        if root != self._directory:  # a new run directory (e.g. the logger's next version) gets its own summary
            self.graphs, self.notes = {}, {}
        self._directory = root
        (root / _STAGING).mkdir(parents=True, exist_ok=True)

    def _save_new_modules(self) -> None:
        if self._strategy is None or self._directory is None:
            return
        for name, ort_module in self._strategy.ort_modules.items():
            if self._configured.get(name) is not ort_module:
                engine.save_graphs(ort_module, self._directory / _STAGING, _prefix(name))
                self._configured[name] = ort_module

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._save_new_modules()

    # ORTStrategy wraps the children instead of `forward` after the first step of a run whose steps
    # never call self(...), so new modules can appear before any batch.
    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._save_new_modules()

    @override
    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._save_new_modules()

    @override
    def on_test_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._save_new_modules()

    @override
    def on_predict_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._save_new_modules()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._strategy is None or self._directory is None:
            return
        reports = reports_by_name(self._strategy)
        for name in self._configured:
            for training, mode in _MODES.items():
                graphs = self._collect(name, training)
                report = reports.get(name)
                reason = None
                if report is not None:
                    reason = report.fallback_reason if training else report.eval_fallback_reason
                key = (name, mode)
                if graphs:
                    self.graphs[key] = graphs
                    self.notes.pop(key, None)
                elif reason is not None:
                    self.graphs.pop(key, None)
                    self.notes[key] = f"ORT gave up on this graph; PyTorch ran the module instead. Reason: {reason}"
                elif key not in self.graphs:
                    self.notes.setdefault(key, "not built: ORT did not run this module in this mode")
        staging = self._directory / _STAGING
        if staging.is_dir() and not any(staging.iterdir()):
            staging.rmdir()
        self._write_summary()
        self._configured = {}

    def _collect(self, name: str, training: bool) -> list[GraphSummary]:
        assert self._directory is not None
        staging = self._directory / _STAGING
        prefix = _prefix(name)
        graphs = []
        for number, stage in enumerate(GRAPH_STAGES, start=1):
            saved = engine.saved_graph_path(staging, prefix, stage, training)
            if not saved.is_file():
                continue
            if stage not in self.stages:
                saved.unlink()
                continue
            target = self._directory / f"{prefix}.{_MODES[training]}.{number}_{stage}.onnx"
            saved.replace(target)
            graphs.append(GraphSummary.of(target))
        return graphs

    def _write_summary(self) -> None:
        assert self._directory is not None
        lines = [
            f"ONNX graphs built by ONNX Runtime {onnxruntime.__version__} (lightning_ort.callbacks.ONNXGraphDump).",
            "Open them in Netron or load them with onnx.load. Parameters are graph inputs: the files hold",
            "structure, not trained weights. Stages: 1 exported by torch.onnx, 2 after ORT's Python rewrites,",
            "3 optimized before the gradient graph (training only), 4 what ORT's graph builder hands to the",
            "session (training: forward and gradients), 5 what the session runs (fused, may be hardware-specific).",
        ]
        for key in sorted({*self.graphs, *self.notes}, key=lambda key: (key[0], key[1] != "training")):
            name, mode = key
            lines.append("")
            if key in self.graphs:
                lines.append(f"{name}, {mode} graph:")
                for graph in self.graphs[key]:
                    lines += graph.lines()
            else:
                lines.append(f"{name}, {mode} graph: {self.notes[key]}")
        path = self._directory / SUMMARY_FILE
        path.write_text("\n".join(lines) + "\n")
        count = sum(len(graphs) for graphs in self.graphs.values())
        log.info("lightning_ort: ONNXGraphDump saved %d graph(s) in %s (summary: %s)", count, self._directory, path)
