"""Eager PyTorch against ORTModule variants in one process, alternating step by step.

    python benchmarks/same_process.py --workloads gpt,encoder,cnn,unet,mlp --variants default,no_rewrites,threads1

Separate processes (benchmarks/run.py) see the shared machine's noise differently; here every
variant trains its own copy of the same model on the same batches, one step each in turn, so the
noise falls on all of them alike. Speed is eager's median step time over the variant's (higher is
faster); ``--faults`` adds each one's page faults per step. Variants: ``default`` (lightning_ort's
defaults), ``no_rewrites`` (``op_rewrites=False``), ``threads<N>`` (``intra_op_num_threads=N``,
e.g. ``threads1``), ``standard_memory`` (``channels_last=False``), ``no_arena``
(``memory_arena=False``), ``fused_attention`` (``fuse_attention=True``), ``spinning``
(``allow_spinning=True``; its spinning threads also slow down whatever runs after it, eager
included, so measure it alone), and ``eager_arena``: eager
PyTorch with every allocation of its steps served by lightning_ort's memory arena (what eager would
gain from a caching allocator; not something lightning_ort does to eager).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from modes import minor_faults  # noqa: E402
from workloads import workloads  # noqa: E402

import lightning_ort  # noqa: E402
from lightning_ort import engine  # noqa: E402
from lightning_ort.engine.runtime import memory_arena  # noqa: E402

EAGER_ARENA = "eager_arena"

VARIANTS = {
    "default": {},
    "no_rewrites": {"op_rewrites": False},
    "spinning": {"allow_spinning": True},
    "standard_memory": {"channels_last": False},
    "no_arena": {"memory_arena": False},
    "fused_attention": {"fuse_attention": True},
}


def variant_options(variant: str) -> dict[str, Any] | None:
    """ORTRuntimeOptions fields of a variant name, or None if the name is unknown."""
    if variant in VARIANTS:
        return VARIANTS[variant]
    if variant == EAGER_ARENA:
        return {}
    threads = variant.removeprefix("threads")
    if threads != variant and threads.isdigit() and int(threads) > 0:
        return {"intra_op_num_threads": int(threads)}
    return None


def measure(name: str, size: str, variants: list[str], steps: int, warmup: int) -> dict[str, float]:
    """Speed of each variant relative to eager (eager's median step / the variant's), eager's median
    step in milliseconds under ``eager_ms`` and each one's median page faults per step under
    ``<variant>_faults`` (``eager_faults`` too)."""
    workload = workloads(size)[name]
    generator = torch.Generator().manual_seed(0)
    batches = [workload.make_batch(generator) for _ in range(warmup + steps)]
    torch.manual_seed(0)
    base = workload.make_model()
    defaults = lightning_ort.ORTStrategy().runtime_options
    runs: dict[str, tuple[Any, list[float], list[int]]] = {}
    for variant in ["eager", *variants]:
        model = copy.deepcopy(base)
        call = model
        if variant == EAGER_ARENA:
            memory_arena.install()
        elif variant != "eager":
            call = engine.wrap_module(model, dataclasses.replace(defaults, **variant_options(variant)))
        optimizer = workload.make_optimizer(list(model.parameters()))
        runs[variant] = ((call, optimizer), [], [])
    for index, batch in enumerate(batches):
        for variant, ((call, optimizer), times, faults) in runs.items():
            start, faults_before = time.perf_counter(), minor_faults()
            with memory_arena.arena_scope(variant == EAGER_ARENA):
                workload.train_step(call, optimizer, batch)
            if index >= warmup:
                times.append(time.perf_counter() - start)
                faults.append(minor_faults() - faults_before)
    eager = statistics.median(runs["eager"][1])
    result = {"eager_ms": eager * 1000}
    for variant, (_, times, faults) in runs.items():
        if variant != "eager":
            result[variant] = eager / statistics.median(times)
        result[f"{variant}_faults"] = statistics.median(faults)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="gpt,encoder,cnn,unet,mlp")
    parser.add_argument("--variants", default="default,no_rewrites")
    parser.add_argument("--size", choices=("tiny", "full"), default="full")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--faults", action="store_true", help="also print page faults per step (median)")
    parser.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    args = parser.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    variants = args.variants.split(",")
    unknown = [v for v in variants if variant_options(v) is None]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}, {EAGER_ARENA} or threads<N>")
    print(f"torch threads: {torch.get_num_threads()}, cores: {os.cpu_count()}")
    columns = ["eager ms/step", *variants]
    if args.faults:
        columns += [f"{v} faults/step" for v in ["eager", *variants]]
    print("| workload | " + " | ".join(columns) + " |")
    print("| --- |" + " --- |" * len(columns))
    for name in args.workloads.split(","):
        speeds = measure(name, args.size, variants, args.steps, args.warmup)
        cells = [f"{speeds['eager_ms']:.1f}", *(f"{speeds[v]:.2f}x" for v in variants)]
        if args.faults:
            cells += [f"{speeds[f'{v}_faults']:.0f}" for v in ["eager", *variants]]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
