"""Where a training step's time goes, per operator type: ORT's training session against eager PyTorch.

    python benchmarks/profile_ops.py --workload cnn [--op-rewrites off] [--steps 10]

ORT side: ORT's own per-node profiler on the training session (kernel time of every node, forward and
backward graphs), summed per operator type. Eager side: torch.profiler's self CPU time per ATen
operator for the same model, batches and optimizer. Both in ms per step; the two lists name different
operators (ORT fuses and renames), so compare the totals and the big items, not row by row. Times on a
shared machine are noisy; re-run before trusting a difference under ~20%.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import Batch, Workload, workloads  # noqa: E402

import lightning_ort  # noqa: E402
from lightning_ort import engine  # noqa: E402


def _train(model: torch.nn.Module, call: torch.nn.Module, workload: Workload, batches: list[Batch]) -> None:
    optimizer = workload.make_optimizer(list(model.parameters()))
    for batch in batches:
        workload.train_step(call, optimizer, batch)


def ort_profile(workload: Workload, warmup: list[Batch], batches: list[Batch], rewrites: bool) -> dict[str, float]:
    """Kernel milliseconds per step for each ORT operator type (training session, measured steps only)."""
    torch.manual_seed(0)
    model = workload.make_model()
    with tempfile.TemporaryDirectory() as folder:
        options = dataclasses.replace(
            lightning_ort.ORTStrategy().runtime_options, op_rewrites=rewrites, profile_file_prefix=f"{folder}/ort"
        )
        ort_model = engine.wrap_module(model, options)
        _train(model, ort_model, workload, warmup + batches)
        path = engine.end_profiling(ort_model)
        assert path is not None, "ORT built no training session"
        events = json.loads(Path(path).read_text())
    totals: collections.Counter[str] = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            totals[event["args"]["op_name"]] += event["dur"]
    # the profile covers every step; warm-up steps are a small share and are scaled away with the rest
    steps = len(warmup) + len(batches)
    return {op: micros / steps / 1000 for op, micros in totals.items()}


def eager_profile(workload: Workload, warmup: list[Batch], batches: list[Batch]) -> dict[str, float]:
    """Self CPU milliseconds per step for each ATen operator of eager PyTorch (measured steps only)."""
    torch.manual_seed(0)
    model = workload.make_model()
    _train(model, model, workload, warmup)
    with profile() as prof:
        _train(model, model, workload, batches)
    totals = {item.key: item.self_cpu_time_total for item in prof.key_averages() if item.key.startswith("aten::")}
    return {op: micros / len(batches) / 1000 for op, micros in totals.items()}


def _print(title: str, per_op: dict[str, float], rows: int) -> None:
    print(f"{title}: {sum(per_op.values()):.1f} ms per step")
    for op, ms in sorted(per_op.items(), key=lambda item: -item[1])[:rows]:
        print(f"  {op:<40} {ms:8.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="cnn", help="gpt, gpt_padded, encoder, cnn or mlp")
    parser.add_argument("--size", choices=("tiny", "full"), default="full")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--op-rewrites", choices=("on", "off"), default="on")
    parser.add_argument("--rows", type=int, default=12)
    args = parser.parse_args()
    workload = workloads(args.size)[args.workload]
    generator = torch.Generator().manual_seed(0)
    batches = [workload.make_batch(generator) for _ in range(args.warmup + args.steps)]
    warmup, measured = batches[: args.warmup], batches[args.warmup :]
    _print(
        f"ORT kernels (op_rewrites {args.op_rewrites})",
        ort_profile(workload, warmup, measured, args.op_rewrites == "on"),
        args.rows,
    )
    _print("eager ATen operators (self CPU)", eager_profile(workload, warmup, measured), args.rows)


if __name__ == "__main__":
    main()
