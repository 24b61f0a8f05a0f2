"""The benchmark command runs end to end at a tiny size (no timing is asserted)."""

from __future__ import annotations

import json
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
        "eager,ort,raw_ort",
        "--out",
        str(tmp_path),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "benchmark.json").read_text())
    for workload in ("gpt", "cnn"):
        for mode in ("eager", "ort", "raw_ort"):
            stats = report["summary"][workload][mode]
            assert "error" not in stats, stats
            assert stats["median_step_s"] > 0 and stats["peak_rss_mb"] > 0
    assert "| gpt |" in (tmp_path / "benchmark.md").read_text()
