"""ORT memory optimization levels 0, 1 and 2 on the GPT-style workload: steps/s and peak memory.

    python benchmarks/memory_levels.py [--batch 32 --seq 128 --steps 10 --repeats 2]

Each level trains in its own process (peak RSS is per process), interleaved and repeated; the
batch is large enough that activations dominate memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _worker(level: int, batch: int, seq: int, steps: int, warmup: int) -> None:
    import torch
    from workloads import GPTBody, _lm_loss

    from lightning_ort import engine

    torch.manual_seed(0)
    model = GPTBody(vocab=1000, d_model=256, layers=4, seq_len=seq)
    ort = engine.wrap_module(model, engine.ORTRuntimeOptions(memory_optimization_level=level))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    generator = torch.Generator().manual_seed(0)
    times, losses = [], []
    for _ in range(warmup + steps):
        window = torch.randint(0, 1000, (batch, seq + 1), generator=generator)
        start = time.perf_counter()
        loss = _lm_loss(ort(window[:, :-1]), window[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
        losses.append(float(loss))
    print(
        json.dumps(
            {
                "level": level,
                "median_step_s": statistics.median(times[warmup:]),
                "losses": losses,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "plans": engine.recompute_plans(ort),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--levels", default="0,1,2")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "memory_levels.json")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        _worker(args.worker, args.batch, args.seq, args.steps, args.warmup)
        return
    levels = [int(level) for level in args.levels.split(",")]
    runs = []
    for repeat in range(args.repeats):
        for level in levels[repeat % len(levels) :] + levels[: repeat % len(levels)]:
            command = [
                sys.executable,
                __file__,
                "--worker",
                str(level),
                "--batch",
                str(args.batch),
                "--seq",
                str(args.seq),
                "--steps",
                str(args.steps),
                "--warmup",
                str(args.warmup),
            ]
            result = subprocess.run(command, capture_output=True, text=True, check=True)
            run = json.loads(result.stdout.strip().splitlines()[-1])
            runs.append(run)
            print(
                f"level {level}: {run['median_step_s'] * 1000:.0f} ms/step, peak RSS {run['peak_rss_mb']:.0f} MB",
                flush=True,
            )
    base = [r for r in runs if r["level"] == levels[0]]
    base_step = statistics.median(r["median_step_s"] for r in base)
    base_rss = statistics.median(r["peak_rss_mb"] for r in base)
    print(f"| level | steps/s vs level {levels[0]} | peak RSS vs level {levels[0]} | recompute plans | same losses |")
    print("| --- | --- | --- | --- | --- |")
    for level in levels:
        mine = [r for r in runs if r["level"] == level]
        step = statistics.median(r["median_step_s"] for r in mine)
        rss = statistics.median(r["peak_rss_mb"] for r in mine)
        same = all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(mine[0]["losses"], base[0]["losses"], strict=True))
        print(f"| {level} | {base_step / step:.2f}x | {rss / base_rss:.2f}x | {len(mine[0]['plans'])} | {same} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
