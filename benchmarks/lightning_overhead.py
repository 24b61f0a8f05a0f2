"""What Lightning + ORTStrategy costs on top of a raw ORTModule loop, measured in one process.

    python benchmarks/lightning_overhead.py --workloads gpt,mlp --rounds 4

Separate processes (benchmarks/run.py) differ by more than the few per cent asked of the strategy on
a shared machine, so here both run in the same process, alternating: each round trains the workload
once through ``Trainer(strategy=ORTStrategy())`` and once through a plain loop around the same kind
of ORTModule (same batches, initial weights and optimizer). Reported: the median over rounds of each
one's median step time after warm-up, and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from modes import run_mode  # noqa: E402
from workloads import workloads  # noqa: E402


def measure(name: str, size: str, steps: int, warmup: int, rounds: int) -> tuple[float, float]:
    """Median step times (seconds) of Lightning + ORTStrategy and of the raw ORTModule loop."""
    workload = workloads(size)[name]
    generator = torch.Generator().manual_seed(0)
    batches = [workload.make_batch(generator) for _ in range(warmup + steps)]
    medians: dict[str, list[float]] = {"ort": [], "raw_ort": []}
    for round_index in range(rounds):
        order = ["ort", "raw_ort"] if round_index % 2 == 0 else ["raw_ort", "ort"]
        for mode in order:
            times = run_mode(mode, workload, batches, "cpu", {}).times
            medians[mode].append(statistics.median(times[warmup:]))
    return statistics.median(medians["ort"]), statistics.median(medians["raw_ort"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="gpt,encoder,cnn,mlp")
    parser.add_argument("--size", choices=("tiny", "full"), default="full")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    print("| workload | Lightning + ORTStrategy | raw ORTModule loop | Lightning / raw |")
    print("| --- | --- | --- | --- |")
    for name in args.workloads.split(","):
        lightning, raw = measure(name, args.size, args.steps, args.warmup, args.rounds)
        print(f"| {name} | {lightning * 1000:.1f} ms | {raw * 1000:.1f} ms | {lightning / raw:.3f} |", flush=True)


if __name__ == "__main__":
    main()
