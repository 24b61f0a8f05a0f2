"""ORT's C++ extension is built once into the cache, reused by later processes, and fails clearly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_ort import ORTSetupError
from lightning_ort._compat import extensions

TRAIN_SNIPPET = """
import lightning as L, torch, lightning_ort
from torch.utils.data import DataLoader, TensorDataset
class M(L.LightningModule):
    def __init__(self):
        super().__init__(); self.layer = torch.nn.Linear(4, 1)
    def forward(self, x): return self.layer(x)
    def training_step(self, batch, i): return self(batch[0]).pow(2).mean()
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.1)
trainer = L.Trainer(strategy="ort", max_steps=2, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(M(), DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4))
print("ORT calls:", trainer.strategy.ort_reports[0].ort_calls)
"""


def test_second_process_reuses_the_built_extension() -> None:
    path, _ = extensions.build_aten_op_executor()
    assert path.is_relative_to(extensions.cache_root())
    assert not path.is_relative_to(Path(sys.prefix))  # never written into site-packages
    stamp = path.stat().st_mtime_ns
    result = subprocess.run([sys.executable, "-c", TRAIN_SNIPPET], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ORT calls: 2" in result.stdout
    assert "building ORT's aten_op_executor" not in result.stderr
    assert path.stat().st_mtime_ns == stamp
    setup = subprocess.run(
        [sys.executable, "-m", "lightning_ort", "setup"], capture_output=True, text=True, timeout=300
    )
    assert setup.returncode == 0, setup.stderr
    assert f"aten_op_executor reused: {path}" in setup.stdout


def test_missing_compiler_is_explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(extensions.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler-g++")
    with pytest.raises(ORTSetupError, match=r"No C\+\+ compiler found \(looked for 'no-such-compiler-g\+\+'\)"):
        extensions.build_aten_op_executor()


def test_unwritable_cache_is_explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(extensions.CACHE_ENV, str(blocker / "cache"))
    with pytest.raises(ORTSetupError, match="Cannot create the extension cache directory .* LIGHTNING_ORT_CACHE"):
        extensions.build_aten_op_executor()


def test_setup_command_reports_errors_without_traceback(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {**os.environ, extensions.CACHE_ENV: str(blocker / "cache")}
    result = subprocess.run(
        [sys.executable, "-m", "lightning_ort", "setup"], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 1
    assert result.stderr.startswith("lightning_ort: Cannot create the extension cache directory")
    assert "Traceback" not in result.stderr


def test_extensions_are_compiled_optimized() -> None:
    # torch's JIT build passes no -O flag: without ours, every ATen node of an ORT graph ran glue
    # code compiled at -O0 (about half of ORT's run time on a small model).
    built = [
        extensions.build_aten_op_executor()[0],
        extensions.build_custom_function_runner()[0],
        extensions.load_aten_ops(),
    ]
    for shared_object in built:
        ninja = (shared_object.parent / "build.ninja").read_text()
        cflags = next(line for line in ninja.splitlines() if line.startswith("cflags ="))
        assert "-O2" in cflags.split(), f"{shared_object.name} was compiled without -O2: {cflags}"
