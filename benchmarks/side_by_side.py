"""Eager Lightning against Lightning + ``ORTStrategy(mode="ort")`` in one process, one training step each in turn.

    python benchmarks/side_by_side.py --workloads bert,gpt2,llama --steps 25 --skip 5 --torch-threads 1

``same_process.py`` compares eager with a bare ORTModule; this compares what a user runs: two Lightning
fits of copies of the same model on the same batches, in two threads that hand a baton to each other
after every training step (``tests/zoo/zoo_harness.py``), so each step runs alone and the machine's
load falls on both alike. It takes every workload of ``workloads.py``, Hugging Face models whose outputs
a bare ORTModule refuses (``DynamicCache``) included, with the workload's own optimizer. Printed: eager's
median step (ms), ORT's speed (eager's median step over ORT's, steps after ``--skip``; above 1: ORT is
faster), the first step of each (ORT's includes its export and build) and the largest |ORT - eager| of
the losses.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT / "tests" / "zoo"), str(ROOT / "tests")]
import zoo_harness  # noqa: E402
from workloads import Unavailable, Workload, call, workloads  # noqa: E402


def measure(workload: Workload, steps: int, skip: int) -> dict[str, Any]:
    def loss(module: Any, batch: Any) -> torch.Tensor:
        x, y = batch
        return workload.loss(call(module, x), y)

    row = zoo_harness.ZooModel(
        workload.name,
        workload.make_model,
        workload.make_batch,
        loss,
        zoo_harness.Expect("all"),
        ort_options={"mode": "ort"},  # whatever the strategy's default mode
        optimizer=workload.make_optimizer,
    )
    result = zoo_harness.run_model(row, steps=steps, runs=("eager", "ort"), alternate=True)
    eager, ort = result.median_step("eager", skip), result.median_step("ort", skip)
    losses = zip(result.runs["eager"].losses, result.runs["ort"].losses, strict=True)
    return {
        "eager_ms": eager * 1000,
        "speed": eager / ort,
        "first": (result.runs["eager"].step_times[0], result.runs["ort"].step_times[0]),
        "loss_diff": max(abs(a - b) for a, b in losses),
        "share": result.runs["ort"].ort_share,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="efficientnet_b0,convnext_tiny,vit_tiny,bert,gpt2,llama")
    parser.add_argument("--size", choices=("tiny", "full"), default="full")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--skip", type=int, default=5, help="first steps left out of the medians")
    parser.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    print(f"torch {torch.__version__}, threads: {torch.get_num_threads()}, cores: {os.cpu_count()}")
    print("| workload | eager ms/step | ORT speed | first step eager / ORT (s) | ORT share | max loss diff |")
    print("| --- | --- | --- | --- | --- | --- |", flush=True)
    table = workloads(args.size)
    for name in args.workloads.split(","):
        try:
            r = measure(table[name], args.steps, args.skip)
        except Unavailable as missing:
            print(f"| {name} | unavailable: {missing} | | | | |", flush=True)
            continue
        except Exception as error:  # one workload's failure is a result too
            print(f"| {name} | error: {str(error)[:300]} | | | | |", flush=True)
            continue
        first = f"{r['first'][0]:.2f} / {r['first'][1]:.2f}"
        cells = [f"{r['eager_ms']:.0f}", f"{r['speed']:.2f}x", first, f"{r['share']:.0%}", f"{r['loss_diff']:.1e}"]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
