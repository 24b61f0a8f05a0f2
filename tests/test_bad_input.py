"""Invalid settings stop with a clear message before any training step (docs/faq.md lists them).

Complements tests/test_strategy.py and tests/test_extension_cache.py, which cover the first of them.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch.utils.cpp_extension
from helpers import LossRecorder, trainer_kwargs
from lightning.pytorch.strategies import StrategyRegistry
from models import MLP, mlp_loader

from lightning_ort import ORTSetupError, ORTStrategy, engine
from lightning_ort.ddp import ORTDDPStrategy
from lightning_ort.engine.bootstrap import custom_function, extensions, flavour

ORTDDPStrategy.register_strategies(StrategyRegistry)  # until lightning_ort/__init__.py registers it


STRATEGIES = [ORTStrategy, ORTDDPStrategy]
OPTION_ERRORS = [
    ({"log_level": "loud"}, ValueError, "(log_level='loud') is not one of VERBOSE, INFO, WARNING, ERROR, FATAL"),
    ({"fallback": None}, ValueError, "(fallback=None) must be 'warn' or 'raise'"),
    ({"modules": "encoder"}, TypeError, "(modules='encoder') must be a list of submodule names, e.g. ['encoder']"),
    ({"modules": ["body", 3]}, TypeError, "(modules=['body', 3]) must be a list of submodule names"),
    ({"intra_op_num_threads": 0}, ValueError, "(intra_op_num_threads=0) must be a positive int"),
    ({"intra_op_num_threads": 2.0}, ValueError, "(intra_op_num_threads=2.0) must be a positive int"),
]
NEW_OPTION_ERRORS = [
    ({"intra_op_num_threads": True}, ValueError, "(intra_op_num_threads=True) must be a positive int"),
    ({"allow_spinning": "no"}, TypeError, "(allow_spinning='no') must be True or False"),
    ({"custom_autograd": "auto"}, TypeError, "(custom_autograd='auto') must be True, False or None"),
    ({"fused_optimizer": "yes"}, TypeError, "(fused_optimizer='yes') must be True or False"),
    ({"memory_arena": "yes"}, TypeError, "(memory_arena='yes') must be True or False"),
    ({"fuse_attention": 1}, TypeError, "(fuse_attention=1) must be True or False"),
]


@pytest.mark.parametrize("cls", STRATEGIES, ids=lambda cls: cls.__name__)
@pytest.mark.parametrize(("kwargs", "error", "message"), OPTION_ERRORS)
def test_bad_options_name_the_strategy_and_the_value(cls: type, kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=re.escape(cls.__name__ + message)):
        cls(**kwargs)


@pytest.mark.parametrize("cls", [ORTStrategy, ORTDDPStrategy], ids=lambda cls: cls.__name__)
@pytest.mark.parametrize(("kwargs", "error", "message"), NEW_OPTION_ERRORS)
def test_wrong_types_are_not_taken_for_truthy_values(cls: type, kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=re.escape(cls.__name__ + message)):
        cls(**kwargs)


@pytest.mark.parametrize("cls", STRATEGIES, ids=lambda cls: cls.__name__)
def test_memory_options_and_precision_are_checked_for_both_strategies(cls: type) -> None:
    with pytest.raises(ValueError, match=re.escape("ORTStrategy(memory_optimization_level=3) must be 0")):
        cls(memory_optimization_level=3)
    with pytest.raises(ValueError, match=re.escape("ORTStrategy(memory_optimizer_config='nope.json'): no such file.")):
        cls(memory_optimizer_config="nope.json")
    message = "ORTStrategy does not support precision='16-true' (HalfPrecision). Use one of 32-true, 16-mixed"
    with pytest.raises(ValueError, match=re.escape(message)):
        L.Trainer(strategy=cls(), precision="16-true", **trainer_kwargs())


def test_ort_strategy_with_several_devices_points_to_ort_ddp() -> None:
    message = "ORTStrategy trains on one device; the Trainer asks for 2 (cpu, cpu). Fix: Trainer(strategy='ort_ddp'"
    with pytest.raises(ValueError, match=re.escape(message)):
        L.Trainer(strategy="ort", **trainer_kwargs(devices=2))


def test_unknown_strategy_variant_is_lightnings_error() -> None:
    with pytest.raises(
        ValueError, match=re.escape("You selected an invalid strategy name: `strategy='ort_ddp_spwan'`")
    ):
        L.Trainer(strategy="ort_ddp_spwan", **trainer_kwargs())


def test_unsupported_ort_version_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flavour, "installed_distributions", lambda: {"onnxruntime-training": "1.20.0"})
    message = "onnxruntime-training==1.20.0 is installed; lightning_ort supports 1.19.x only. Fix: pip install"
    with pytest.raises(ORTSetupError, match=re.escape(message)):
        flavour.check_installation()


def test_mismatched_flavour_stops_fit_before_any_step(monkeypatch: pytest.MonkeyPatch) -> None:
    installed = flavour.installed_distributions()
    monkeypatch.setattr(flavour, "installed_distributions", lambda: {**installed, "onnxruntime-gpu": "1.19.2"})
    recorder = LossRecorder()
    trainer = L.Trainer(strategy="ort", max_steps=2, callbacks=[recorder], **trainer_kwargs())
    with pytest.raises(ORTSetupError, match="Several distributions provide the `onnxruntime` module"):
        trainer.fit(MLP(), mlp_loader())
    assert recorder.losses == [] and trainer.global_step == 0


def test_read_only_cache_directory_is_explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "read-only"
    cache.mkdir()
    monkeypatch.setenv(extensions.CACHE_ENV, str(cache))
    original = Path.mkdir

    def mkdir(self: Path, *args: Any, **kwargs: Any) -> None:
        # what a non-root user gets in a read-only directory (root ignores the permission bits)
        if self.is_relative_to(cache):
            raise PermissionError(13, "Permission denied", str(self))
        original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    message = f"Cannot create the extension cache directory {cache}/extensions/aten_op_executor-"
    with pytest.raises(
        ORTSetupError, match=re.escape(message) + r".*Permission denied.*Fix: point LIGHTNING_ORT_CACHE"
    ):
        extensions.build_aten_op_executor()


def test_read_only_cache_that_holds_the_build_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache filled by `python -m lightning_ort setup` (e.g. in a Docker image) is only read."""
    built, _ = extensions.build_aten_op_executor()
    cache = tmp_path / "cache"
    shutil.copytree(built.parent, cache / "extensions" / built.parent.name)
    monkeypatch.setenv(extensions.CACHE_ENV, str(cache))
    monkeypatch.setattr(Path, "mkdir", lambda *args, **kwargs: pytest.fail("the cache was written to"))
    path, was_built = extensions.build_aten_op_executor()
    assert path == cache / "extensions" / built.parent.name / built.name and not was_built


def test_missing_ninja_is_explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(extensions.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(torch.utils.cpp_extension, "is_ninja_available", lambda: False)
    with pytest.raises(ORTSetupError, match=re.escape("ninja was not found. ") + ".*Fix: pip install ninja"):
        extensions.build_aten_op_executor()


def test_custom_autograd_without_a_compiler_stops_fit_before_any_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    support = engine.custom_function_support_enabled()
    monkeypatch.setenv(extensions.CACHE_ENV, str(tmp_path))  # nothing built here yet
    monkeypatch.setenv("CXX", "no-such-compiler-g++")
    monkeypatch.setattr(custom_function, "_runner_module", None)
    monkeypatch.delitem(sys.modules, extensions.CUSTOM_FUNCTION_RUNNER, raising=False)
    monkeypatch.setattr(custom_function, "_unavailable_reason", None)
    recorder = LossRecorder()
    trainer = L.Trainer(
        strategy=ORTStrategy(custom_autograd=True), max_steps=2, callbacks=[recorder], **trainer_kwargs()
    )
    message = "Custom autograd.Function support inside ORT is unavailable: No C++ compiler found"
    try:
        with pytest.raises(ORTSetupError, match=re.escape(message)):
            trainer.fit(MLP(), mlp_loader())
    finally:
        monkeypatch.undo()
        engine.custom_function_support(support)
    assert recorder.losses == [] and trainer.global_step == 0


def test_custom_autograd_on_older_torch_is_refused_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """On torch < 2.13 the runner's backward failed (torch 2.11): such modules train in PyTorch, with
    the reason, and asking for the support explicitly stops with the fix."""
    support = engine.custom_function_support_enabled()
    monkeypatch.setattr(custom_function, "_unavailable_reason", None)
    monkeypatch.setattr(torch, "__version__", "2.11.0+cpu")
    try:
        assert custom_function.custom_function_support(None) is False
        assert "needs torch >= 2.13 (installed: 2.11.0+cpu" in custom_function.support_off_reason()
        with pytest.raises(ORTSetupError, match=re.escape("Fix: pip install 'torch>=2.13'")):
            custom_function.custom_function_support(True)
    finally:
        monkeypatch.undo()
        engine.custom_function_support(support)
    assert engine.custom_function_support_enabled() == support
