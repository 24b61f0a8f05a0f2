"""Registration, options, teardown and isolation of ORTStrategy."""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import os
import re
import subprocess
import sys

import lightning as L
import pytest
import torch
from helpers import fit, trainer_kwargs
from lightning.pytorch.strategies import StrategyRegistry
from models import MLP, mlp_loader

import lightning_ort
from lightning_ort import ORTSetupError, ORTStrategy
from lightning_ort.engine.bootstrap import flavour


def test_registered_as_ort() -> None:
    assert "ort" in StrategyRegistry
    trainer = L.Trainer(strategy="ort", **trainer_kwargs())
    assert isinstance(trainer.strategy, ORTStrategy)
    assert trainer.strategy.root_device == torch.device("cpu")
    lightning_ort.ORTStrategy.register_strategies(StrategyRegistry)  # importing twice is harmless


def test_teardown_leaves_the_module_as_given() -> None:
    model = MLP()
    result = fit(model, mlp_loader(), "ort", max_steps=3)
    assert result.reports[0].ort_calls == 3
    assert "forward" not in model.__dict__
    x = torch.randn(4, 16)
    torch.testing.assert_close(model(x), MLP.forward(model, x))
    assert not any(type(m).__name__.endswith("ORTAdapter") for m in model.modules())


def test_user_torch_onnx_export_keeps_torch_default() -> None:
    original = torch.onnx.export
    fit(MLP(), mlp_loader(), "ort", max_steps=2)
    assert torch.onnx.export is original
    assert inspect.signature(torch.onnx.export).parameters["dynamo"].default is True


def test_environment_is_not_changed_by_a_run() -> None:
    before = dict(os.environ)
    fit(MLP(), mlp_loader(), ORTStrategy(log_level="ERROR", intra_op_num_threads=1), max_steps=2)
    assert dict(os.environ) == before


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"log_level": "LOUD"},
            ValueError,
            "ORTStrategy(log_level='LOUD') is not one of VERBOSE, INFO, WARNING, ERROR, FATAL",
        ),
        ({"fallback": "ignore"}, ValueError, "ORTStrategy(fallback='ignore') must be 'warn' or 'raise'"),
        ({"modules": "encoder"}, TypeError, "must be a list of submodule names"),
        ({"intra_op_num_threads": 0}, ValueError, "must be a positive int"),
    ],
)
def test_bad_options_are_rejected_at_construction(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        ORTStrategy(**kwargs)


def test_unknown_submodule_named_before_training() -> None:
    with pytest.raises(ValueError, match=r"MLP has no submodule 'encoder' \(its children: body, head\)"):
        fit(MLP(), mlp_loader(), ORTStrategy(modules=["encoder"]), max_steps=1)


def test_overlapping_submodules_rejected() -> None:
    with pytest.raises(ValueError, match="'body.0' is inside 'body'"):
        fit(MLP(), mlp_loader(), ORTStrategy(modules=["body", "body.0"]), max_steps=1)


def test_cuda_device_with_cpu_flavour_is_explained() -> None:
    with pytest.raises(ORTSetupError, match=r"has no CUDA provider.*lightning-ort\[cuda\]"):
        flavour.check_device(torch.device("cuda", 0))


def test_conflicting_onnxruntime_distributions_are_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    installed = flavour.installed_distributions()
    monkeypatch.setattr(flavour, "installed_distributions", lambda: {**installed, "onnxruntime": "1.23.0"})
    with pytest.raises(ORTSetupError, match=r"Several distributions provide the `onnxruntime` module.*pip uninstall"):
        flavour.check_installation()
    monkeypatch.setattr(flavour, "installed_distributions", lambda: {"onnxruntime": "1.23.0"})
    with pytest.raises(ORTSetupError, match=r"No ONNX Runtime training build.*onnxruntime has no training code"):
        flavour.check_installation()


def test_loading_ort_leaves_the_root_logger_alone() -> None:
    # ORT's modules call logging.basicConfig at import; a fresh process shows whether it leaks.
    code = (
        "import logging; from lightning_ort import engine; engine.ortmodule_package(); "
        "root = logging.getLogger(); print(len(root.handlers), root.level)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["0", str(logging.WARNING)]


def test_trains_in_ort_when_stdout_has_no_file_descriptor() -> None:
    # notebooks and IDE consoles replace sys.stdout with objects that have no file descriptor
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        result = fit(MLP(), mlp_loader(), "ort", max_steps=3)
    assert result.reports[0].fallback_reason is None
    assert result.reports[0].ort_calls == 3
