"""The benchmark command runs end to end at a tiny size (no timing is asserted)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_benchmark_runs_tiny_and_writes_results(tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "run.py"),
        "--size",
        "tiny",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--repeats",
        "1",
        "--workloads",
        "gpt,cnn",
        "--modes",
        "eager,ort,ort_no_rewrites,ort_no_arena,raw_ort,raw_eager",
        "--out",
        str(tmp_path),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "benchmark.json").read_text())
    for workload in ("gpt", "cnn"):
        for mode in ("eager", "ort", "ort_no_rewrites", "ort_no_arena", "raw_ort", "raw_eager"):
            stats = report["summary"][workload][mode]
            assert "error" not in stats, stats
            assert stats["median_step_s"] > 0 and stats["peak_rss_mb"] > 0 and stats["faults_per_step"] >= 0
    assert "| gpt |" in (tmp_path / "benchmark.md").read_text()
    assert (tmp_path / "benchmark.png").read_bytes().startswith(b"\x89PNG")


def test_operator_profile_runs_tiny() -> None:
    command = [sys.executable, str(ROOT / "benchmarks" / "profile_ops.py"), "--workload", "cnn", "--size", "tiny"]
    command += ["--steps", "2", "--warmup", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    # the ORT side lists ORT's own node types, the rewritten convolutions among them (ATen nodes)
    ort_part, eager_part = result.stdout.split("eager ATen operators")
    assert "ATen" in ort_part and "aten::convolution_backward" in eager_part


def test_lightning_overhead_runs_tiny() -> None:
    command = [sys.executable, str(ROOT / "benchmarks" / "lightning_overhead.py"), "--size", "tiny"]
    command += ["--workloads", "mlp", "--rounds", "1", "--steps", "2", "--warmup", "1", "--probe-steps", "3"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"the strategy and Lightning add -?\d+\.\d+ ms per step", result.stdout)
    assert re.search(r"Lightning's own loop costs -?\d+\.\d+ ms of it, the strategy -?\d+\.\d+ ms", result.stdout)
    assert re.search(r"\| mlp \| .* \| [+-]\d+\.\d%", result.stdout)


def test_same_process_comparison_runs_tiny() -> None:
    command = [sys.executable, str(ROOT / "benchmarks" / "same_process.py"), "--size", "tiny"]
    command += ["--workloads", "cnn,unet", "--variants", "default,no_rewrites,no_arena,eager_arena", "--faults"]
    command += ["--steps", "2", "--warmup", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| cnn |" in result.stdout and "| unet |" in result.stdout and result.stdout.count("x |") == 8
    assert "| no_arena faults/step |" in result.stdout


def test_a_library_workload_that_does_not_import_is_marked_unavailable(tmp_path: Path) -> None:
    """torchvision/timm models build only where their library imports; elsewhere the table says so."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import run  # noqa: PLC0415
        import workloads  # noqa: PLC0415
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    broken = workloads._library_model("lightning_ort_no_such_library", lambda module: module)
    try:
        broken()
    except workloads.Unavailable as missing:
        message = str(missing)
    else:
        raise AssertionError("a library that does not import gave a model")
    runs = [
        {"workload": "resnet18", "mode": mode, "unavailable": message} for mode in ("eager", "ort", "ort_auto")
    ] + [
        {"workload": "mlp", "mode": mode, "median_step_s": 0.1, "first_step_s": 1.0, "peak_rss_mb": 10.0,
         "median_faults_per_step": 0, "auto_choices": "forward: ort (ORT at 1.10x)" if mode == "ort_auto" else ""}
        for mode in ("eager", "ort", "ort_auto")
    ]  # fmt: skip
    table = run._table(run._summarise(runs, ["mlp", "resnet18"], ["eager", "ort", "ort_auto"]), ["eager", "ort"])
    assert "| resnet18 | unavailable |" in table
    assert "resnet18: unavailable: lightning_ort_no_such_library does not import here" in table
    assert "mlp, ort_auto: chose forward: ort (ORT at 1.10x)" in table
