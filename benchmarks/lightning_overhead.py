"""What Lightning + ORTStrategy costs on top of a raw ORTModule loop, measured in one process.

    python benchmarks/lightning_overhead.py --workloads gpt,encoder,cnn,mlp --rounds 4

Separate processes (benchmarks/run.py) differ by more than the few per cent asked of the strategy on
a shared machine, so here both run in the same process, alternating: each round trains the workload
once through ``Trainer(strategy=ORTStrategy())`` and once through a plain loop around the same kind
of ORTModule (same batches, initial weights and optimizer). A Lightning step is timed from one
training batch's start to the next one's, so that everything the Trainer does between batches
counts; a loop step is one iteration. Reported: the median over rounds of each one's median step
after warm-up, and their ratio.

The ratio of two 50-200 ms steps moves by several per cent with the machine's load. The cost
Lightning and the strategy add per step does not grow with the model, so it is also measured
directly (``--probe-steps``): the same comparison on a model so small that the step is little more
than that cost, with hundreds of steps per round. Its difference, in milliseconds, over each
workload's raw step is the share the strategy adds to that workload.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from modes import run_mode  # noqa: E402
from workloads import Batch, Workload, workloads  # noqa: E402


class BatchIntervals(L.Callback):
    """Wall time from each training batch's start to the next one's (the Trainer's whole loop)."""

    def __init__(self) -> None:
        self.starts: list[float] = []

    def on_train_batch_start(self, *args: Any) -> None:
        self.starts.append(time.perf_counter())

    def on_train_end(self, *args: Any) -> None:
        self.starts.append(time.perf_counter())

    @property
    def intervals(self) -> list[float]:
        return [end - start for start, end in zip(self.starts, self.starts[1:], strict=False)]


def _probe() -> Workload:
    """A model whose training step costs well under a millisecond of compute."""

    def make_model() -> nn.Module:
        return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))

    def make_batch(g: torch.Generator) -> Batch:
        return torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)

    return Workload("probe", make_model, make_batch, F.cross_entropy, lambda p: torch.optim.SGD(p, lr=0.01))


def measure(workload: Workload, steps: int, warmup: int, rounds: int, modes: Sequence[str]) -> dict[str, float]:
    """Median step time (seconds) of each mode (``ort``/``eager``: Lightning; ``raw_ort``/``raw_eager``: a plain
    loop), over rounds that alternate the order of the modes."""
    generator = torch.Generator().manual_seed(0)
    batches = [workload.make_batch(generator) for _ in range(warmup + steps)]
    medians: dict[str, list[float]] = {mode: [] for mode in modes}
    for round_index in range(rounds):
        for mode in modes if round_index % 2 == 0 else reversed(modes):
            intervals = BatchIntervals()
            times = run_mode(mode, workload, batches, "cpu", {}, [intervals]).times
            if not mode.startswith("raw_"):
                times = intervals.intervals
            medians[mode].append(statistics.median(times[warmup:]))
    return {mode: statistics.median(values) for mode, values in medians.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="gpt,encoder,cnn,mlp")
    parser.add_argument("--size", choices=("tiny", "full"), default="full")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--probe-steps", type=int, default=300, help="steps per round of the tiny probe (0: skip)")
    args = parser.parse_args()
    added = None
    if args.probe_steps:
        probe = measure(_probe(), args.probe_steps, 20, args.rounds, ("ort", "raw_ort", "eager", "raw_eager"))
        added = probe["ort"] - probe["raw_ort"]
        lightning_loop = probe["eager"] - probe["raw_eager"]
        print(
            f"tiny probe: Lightning + ORTStrategy {probe['ort'] * 1000:.3f} ms/step, raw ORTModule loop "
            f"{probe['raw_ort'] * 1000:.3f} ms/step: the strategy and Lightning add {added * 1000:.3f} ms per step;\n"
            f"eager Lightning {probe['eager'] * 1000:.3f} ms/step, eager loop {probe['raw_eager'] * 1000:.3f} ms/step: "
            f"Lightning's own loop costs {lightning_loop * 1000:.3f} ms of it, the strategy "
            f"{(added - lightning_loop) * 1000:.3f} ms\n"
        )
    print("| workload | Lightning + ORTStrategy | raw ORTModule loop | Lightning / raw | probe's added cost / raw |")
    print("| --- | --- | --- | --- | --- |")
    for name in args.workloads.split(","):
        times = measure(workloads(args.size)[name], args.steps, args.warmup, args.rounds, ("ort", "raw_ort"))
        lightning, raw = times["ort"], times["raw_ort"]
        share = "" if added is None else f"{added / raw:+.1%}"
        print(
            f"| {name} | {lightning * 1000:.1f} ms | {raw * 1000:.1f} ms | {lightning / raw:.3f} | {share} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
