"""ORT's C++ extension is built once into the cache, reused by later processes, and fails clearly."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_ort import ORTSetupError
from lightning_ort.engine.bootstrap import extensions

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
    assert "compiling" not in result.stderr
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


def _cache_with(tmp_path: Path, shared_objects: list[Path]) -> Path:
    """A fresh extension cache holding only the build directories of ``shared_objects`` (links to them)."""
    extensions_dir = tmp_path / "cache" / "extensions"
    extensions_dir.mkdir(parents=True)
    for shared_object in shared_objects:
        (extensions_dir / shared_object.parent.name).symlink_to(shared_object.parent)
    return tmp_path / "cache"


def test_a_model_without_custom_functions_builds_no_runner(tmp_path: Path) -> None:
    # The custom-Function runner took a third of a fresh machine's first fit to compile, for models
    # that have no custom Function; it is compiled when a graph runs one (next test).
    cache = _cache_with(tmp_path, [extensions.build_aten_op_executor()[0], extensions.build_aten_ops()[0]])
    snippet = TRAIN_SNIPPET + "print('support on:', lightning_ort.engine.custom_function_support_enabled())\n"
    env = {**os.environ, extensions.CACHE_ENV: str(cache)}
    result = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ORT calls: 2" in result.stdout
    assert "support on: True" in result.stdout  # on, with the runner still to build
    assert "compiling" not in result.stderr
    built = sorted(path.name.rsplit("-", 1)[0] for path in (cache / "extensions").iterdir())
    assert built == ["aten_op_executor", extensions.ATEN_OPS]


RUNNER_SNIPPET = """
import copy, os, sys, torch
from lightning_ort import engine
class Sign(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x): return torch.sign(x)
    @staticmethod
    def backward(ctx, grad): return grad * 3  # not sign's gradient (zero): only the runner computes it
class User(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.layer = torch.nn.Linear(4, 4)
    def forward(self, x): return Sign.apply(self.layer(x))
assert engine.custom_function_support(None) is True
assert "lightning_ort_custom_function_runner" not in sys.modules  # support on, nothing built or loaded
os.symlink(sys.argv[1], os.path.join(sys.argv[2], os.path.basename(sys.argv[1])))  # "built" from here on
torch.manual_seed(0)
eager = User()
twin = copy.deepcopy(eager)
ort = engine.wrap_module(twin, engine.ORTRuntimeOptions(log_level="ERROR"))
x = torch.randn(3, 4)
eager(x).sum().backward()
ort(x).sum().backward()
print("max difference:", (twin.layer.weight.grad - eager.layer.weight.grad).abs().max().item())
print("runner loaded:", "lightning_ort_custom_function_runner" in sys.modules)
"""


def test_the_runner_is_loaded_when_a_graph_runs_a_custom_function(tmp_path: Path) -> None:
    cache = _cache_with(tmp_path, [extensions.build_aten_op_executor()[0], extensions.build_aten_ops()[0]])
    runner, _ = extensions.build_custom_function_runner()
    env = {**os.environ, extensions.CACHE_ENV: str(cache)}
    result = subprocess.run(
        [sys.executable, "-c", RUNNER_SNIPPET, str(runner.parent), str(cache / "extensions")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "runner loaded: True" in result.stdout
    assert "max difference: 0.0" in result.stdout, result.stdout


def _namespace_scope_functions(text: str) -> set[str]:
    """Names of the functions a C++ file defines at namespace scope (its definitions start at column 0)."""
    pattern = r"^(?![\s#}])(?!TORCH_|namespace|template|using|return)[^\n(;=]*?\b(\w+)\s*\("
    return set(re.findall(pattern, text, re.MULTILINE))


def _code(path: Path) -> str:
    """``path``'s text without comments and string literals."""
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', re.sub(r"//.*", "", path.read_text()))


def test_operator_files_can_share_one_translation_unit() -> None:
    # They compile as one unit (extensions._aten_ops_unity); a function one file defines would join the
    # overloads another file's unqualified call of that name chooses from, and could change its choice.
    sources = extensions.aten_ops_sources()
    defined = {source.name: _namespace_scope_functions(_code(source)) for source in sources}
    assert len(defined["torch_kernels.cc"]) > 10  # the pattern finds the definitions
    for source in sources:
        code = _code(source)
        for other, names in defined.items():
            for name in sorted(names - defined[source.name]) if other != source.name else []:
                call = re.search(rf"(?<![\w:.>]){name}\s*[(<]", code)
                assert call is None, f"{source.name} calls {name}, which {other} defines: rename one of them"
