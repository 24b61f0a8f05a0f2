"""Benchmark eager Lightning, Lightning + strategy="ort" (mode="ort" and mode="auto", with and without
op_rewrites), a raw ORTModule loop and torch.compile, on hand-written workloads and on real libraries' models
(torchvision: ResNet-18, MobileNetV3, EfficientNet-B0, ConvNeXt-Tiny; timm: ResNet-18d, ViT-Tiny;
transformers: BERT, GPT-2, Llama; random weights from configs, nothing downloaded).

    python benchmarks/run.py                      # full size, all workloads; eager, ort, ort_auto, compile
    python benchmarks/run.py --size tiny --steps 3 --warmup 1 --repeats 1   # smoke run
    python benchmarks/run.py --modes eager,ort,ort_no_arena   # with and without the memory arena
    python benchmarks/run.py --workloads bert,gpt2,llama --steps 40 --warmup 5 --torch-threads 1

Every (workload, mode) trains in its own process on the same batches and initial weights; modes
are interleaved and repeated so that they share the machine's noise. Reported: the median step time
after warm-up, the first step (export/compile included) and peak RSS, as ratios to eager, and for
``ort_auto`` what ``mode="auto"`` chose and ORT's speed it measured ("ort 1.04x"). ``ort_auto`` needs
about 20 training steps to measure (fewer: it trains in PyTorch from the start). A library that does not
import in the interpreter (torchvision and timm in the project's venv) makes its rows "unavailable": run
them in `.venv-torch-2.15.0` (`bash scripts/test_torch.sh 2.15.0 --co -q tests/test_strategy.py`).
Separate processes see a shared machine's noise differently: benchmarks/same_process.py measures the
ratio of ORT to eager side by side in one process.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _worker(args: argparse.Namespace) -> None:
    import torch
    from modes import run_mode
    from workloads import Unavailable, workloads

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    workload = workloads(args.size)[args.workload]
    generator = torch.Generator().manual_seed(0)
    batches = [workload.make_batch(generator) for _ in range(args.warmup + args.steps)]
    device = (
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    ort_options = json.loads(args.ort_options)
    start = time.perf_counter()
    try:
        times, faults, choices = run_mode(args.mode, workload, batches, device, ort_options)
    except Unavailable as missing:  # a library's model that does not import in this environment
        print(json.dumps({"workload": args.workload, "mode": args.mode, "unavailable": str(missing)}))
        return
    total = time.perf_counter() - start
    print(
        json.dumps(
            {
                "workload": args.workload,
                "mode": args.mode,
                "device": device,
                "first_step_s": times[0],
                "median_step_s": statistics.median(times[args.warmup :]),
                "step_times_s": times,
                "median_faults_per_step": statistics.median(faults[args.warmup :]),
                "total_s": total,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "torch_threads": torch.get_num_threads(),
                "auto_choices": choices,
            }
        )
    )


def _run_one(args: argparse.Namespace, workload: str, mode: str) -> dict[str, Any]:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--workload",
        workload,
        "--mode",
        mode,
        "--size",
        args.size,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--device",
        args.device,
        "--ort-options",
        args.ort_options,
        "--torch-threads",
        str(args.torch_threads or 0),
    ]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if result.returncode != 0:
        return {"workload": workload, "mode": mode, "error": result.stderr.strip().splitlines()[-1:]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def _summarise(runs: list[dict[str, Any]], workload_names: list[str], modes: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for workload in workload_names:
        per_mode: dict[str, Any] = {}
        missing = [r["unavailable"] for r in runs if r["workload"] == workload and "unavailable" in r]
        if missing:
            summary[workload] = {mode: {"unavailable": missing[0]} for mode in modes}
            continue
        for mode in modes:
            ok = [r for r in runs if r["workload"] == workload and r["mode"] == mode and "error" not in r]
            errors = [r["error"] for r in runs if r["workload"] == workload and r["mode"] == mode and "error" in r]
            if not ok:
                per_mode[mode] = {"error": errors[0] if errors else "not run"}
                continue
            per_mode[mode] = {
                "median_step_s": statistics.median(r["median_step_s"] for r in ok),
                "first_step_s": statistics.median(r["first_step_s"] for r in ok),
                "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in ok),
                "faults_per_step": statistics.median(r["median_faults_per_step"] for r in ok),
            }
            choices = [r["auto_choices"] for r in ok if r.get("auto_choices")]
            if choices:
                per_mode[mode]["auto_choices"] = "; ".join(choices)
        eager = per_mode.get("eager", {})
        for stats in per_mode.values():
            if "error" not in stats and "error" not in eager and eager:
                stats["speed_vs_eager"] = eager["median_step_s"] / stats["median_step_s"]
                stats["memory_vs_eager"] = stats["peak_rss_mb"] / eager["peak_rss_mb"]
        summary[workload] = per_mode
    return summary


def _table(summary: dict[str, Any], modes: list[str]) -> str:
    columns = [
        ("speed", "speed_vs_eager", "{:.2f}x"),
        ("1st step", "first_step_s", "{:.2f} s"),
        ("peak RSS", "memory_vs_eager", "{:.2f}x"),
        ("faults/step", "faults_per_step", "{:.0f}"),
    ]
    header = [f"{mode} {title}" for title, _, _ in columns for mode in modes]
    auto = [mode for mode in modes if mode == "ort_auto"]  # mode="auto": what it chose, ORT's measured speed
    header += [f"{mode} choice" for mode in auto]
    lines = ["| workload | " + " | ".join(header) + " |", "| --- " * (1 + len(header)) + "|"]
    notes = []
    for workload, per_mode in summary.items():
        cells = [
            form.format(per_mode[mode][key])
            if key in per_mode[mode]
            else ("unavailable" if "unavailable" in per_mode[mode] else "error")
            for _, key, form in columns
            for mode in modes
        ]
        cells += [_choices(per_mode[mode]) for mode in auto]
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
        stats = next(iter(per_mode.values()), {})
        if "unavailable" in stats:
            notes.append(f"{workload}: unavailable: {stats['unavailable']}")
        chosen = [(mode, stats) for mode, stats in per_mode.items() if "auto_choices" in stats]
        notes += [f"{workload}, {mode}: chose {stats['auto_choices']}" for mode, stats in chosen]
    return "\n".join(lines + ([""] + notes if notes else []))


def _choices(stats: dict[str, Any]) -> str:
    """mode="auto"'s choices of one workload's runs, short: "ort 1.04x" per run (module names left out if
    there is one module, "forward")."""
    if "auto_choices" not in stats:
        return "unavailable" if "unavailable" in stats else "error" if "error" in stats else ""
    short = stats["auto_choices"].replace(" (ORT at ", " ").replace(")", "").replace("forward: ", "")
    return short.replace(" (run too short to measure", " (too short)")


def _chart(summary: dict[str, Any], modes: list[str], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    workloads = list(summary)
    width = 0.8 / len(modes)
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, mode in enumerate(modes):
        values = [summary[w][mode].get("speed_vs_eager", 0.0) for w in workloads]
        ax.bar([x + i * width for x in range(len(workloads))], values, width, label=mode)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + width * (len(modes) - 1) / 2 for x in range(len(workloads))], workloads)
    ax.set_ylabel("training speed vs eager (higher is faster)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=("tiny", "full"), default="full")
    parser.add_argument(
        "--workloads",
        default="gpt,gpt_padded,encoder,cnn,unet,mlp,resnet18,resnet18d,mobilenetv3,efficientnet_b0,convnext_tiny,"
        "vit_tiny,bert,gpt2,llama",
    )
    parser.add_argument("--modes", default="eager,ort,ort_auto,compile")
    parser.add_argument("--steps", type=int, default=15, help="measured steps per run (after warm-up)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repetitions of every run")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    parser.add_argument(
        "--ort-options",
        default="{}",
        help="ORTStrategy keyword arguments as JSON, e.g. '{\"intra_op_num_threads\": 2}'",
    )
    parser.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads in every run (0: default)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    names, modes = args.workloads.split(","), args.modes.split(",")
    runs = []
    for repeat in range(args.repeats):
        for workload in names:
            order = modes[repeat % len(modes) :] + modes[: repeat % len(modes)]
            for mode in order:
                run = _run_one(args, workload, mode)
                runs.append(run)
                status = run.get("error") or run.get("unavailable") or f"{run['median_step_s'] * 1000:.1f} ms/step"
                print(f"[{repeat + 1}/{args.repeats}] {workload:<10} {mode:<8} {status}", flush=True)
    summary = _summarise(runs, names, modes)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "cpu_count": os.cpu_count(),
        "summary": summary,
        "runs": runs,
    }
    (args.out / "benchmark.json").write_text(json.dumps(report, indent=2))
    table = _table(summary, modes)
    (args.out / "benchmark.md").write_text(table + "\n")
    print(table)
    if _chart(summary, modes, args.out / "benchmark.png"):
        print(f"chart: {args.out / 'benchmark.png'}")
    else:
        print("no chart: matplotlib is not installed (pip install 'lightning-ort[bench]')")
    print(f"results: {args.out / 'benchmark.json'}")


if __name__ == "__main__":
    main()
