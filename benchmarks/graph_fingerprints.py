"""Fingerprints of the graphs ORT builds for the benchmark workloads: a refactoring check.

Each workload trains for two steps under ``ORTStrategy(mode="ort")``, as ``run.py`` trains it; the script prints one
line per wrapped module with a hash of the exported ONNX model and of the processed training graph (the export
after lightning_ort's passes). Run it before and after a change that should not alter any graph, and
compare the output:

    python benchmarks/graph_fingerprints.py > before.txt   # on the old commit
    python benchmarks/graph_fingerprints.py > after.txt    # on the new one
    diff before.txt after.txt

The script runs itself with ``PYTHONHASHSEED=0``: ORT's shape inference names some symbolic dimensions in
set order. Workloads whose library does not import here (torchvision, timm) print ``unavailable``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lightning.pytorch as L  # noqa: E402
from modes import run_mode  # noqa: E402
from workloads import Unavailable, Workload, workloads  # noqa: E402

try:
    from lightning_ort import engine
except ImportError:  # commits before the engine package (lightning_ort._compat)
    from lightning_ort import _compat as engine  # type: ignore[no-redef]


class _Graphs(L.Callback):
    """Hashes of each wrapped module's exported and processed training graphs, at the end of training."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for name, ort_module in sorted(trainer.strategy.ort_modules.items()):
            processed = engine.processed_model(ort_module, True)
            nodes = len(processed.graph.node) if processed is not None else 0
            exported = _digest(engine.exported_model(ort_module, True))
            self.lines.append(f"{name}: exported {exported}  processed {_digest(processed)}  ({nodes} nodes)")


def _digest(model: onnx.ModelProto | None) -> str:
    """A hash of the graph (nodes, initializers' names and shapes, inputs, outputs), not of weights' values."""
    if model is None:
        return "none"
    graph = onnx.GraphProto()
    graph.CopyFrom(model.graph)
    for initializer in graph.initializer:
        initializer.ClearField("raw_data")
        initializer.ClearField("float_data")
    return hashlib.sha256(graph.SerializeToString(deterministic=True)).hexdigest()[:16]


def fingerprint(workload: Workload) -> list[str]:
    """One line per module ORT trains in ``workload``: hashes of its exported and processed training graphs."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    batches = [workload.make_batch(generator) for _ in range(2)]
    graphs = _Graphs()
    run_mode("ort", workload, batches, "cpu", {}, callbacks=[graphs])
    return graphs.lines


def main() -> None:
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny", choices=("tiny", "full"))
    parser.add_argument("names", nargs="*", help="workloads (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name, workload in workloads(args.size).items():
        if args.names and name not in args.names:
            continue
        try:
            lines = fingerprint(workload)
        except Unavailable as missing:
            print(f"{name:14s} unavailable ({missing})", flush=True)
            continue
        for line in lines:
            print(f"{name:14s} {line}", flush=True)


if __name__ == "__main__":
    main()
