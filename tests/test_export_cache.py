"""ORTStrategy(export_cache=True): a later run of an identical model reuses the ONNX export, any
difference the export depends on gives a new export, and nothing unsafe is ever reused."""

from __future__ import annotations

import copy
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit
from models import CNN, MLP, NoGradInForward, image_loader, mlp_loader
from test_custom_function import STEMLP

import lightning_ort
from lightning_ort.engine.export import export_cache

STEPS = 3


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(export_cache, "cache_root", lambda: tmp_path)
    return tmp_path / "exports"


@pytest.fixture
def exports(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every real torch.onnx.export call (a cache hit makes none)."""
    calls: list[Any] = []
    original = torch.onnx.export

    def counting_export(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(torch.onnx, "export", counting_export)
    return calls


def _fit(model: torch.nn.Module, **options: Any) -> Any:
    return fit(model, mlp_loader(), lightning_ort.ORTStrategy(export_cache=True, **options), STEPS)


def test_second_run_reuses_the_export_and_trains_the_same(
    cache_dir: Path, exports: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    model = MLP()
    twin, eager_model = copy.deepcopy(model), copy.deepcopy(model)
    with caplog.at_level(logging.INFO, logger="lightning_ort"):
        first = _fit(model)
        assert len(exports) == 1 and "cached the ONNX export" in caplog.text
        caplog.clear()
        second = _fit(twin)
    assert len(exports) == 1, "the second run exported again"
    assert "reused the cached ONNX export" in caplog.text and "DELETE" not in caplog.text
    assert len(list(cache_dir.iterdir())) == 1
    eager = fit(eager_model, mlp_loader(), "auto", STEPS)
    for run in (first, second):
        assert_ort_ran(run, STEPS)
        assert_losses_match(eager, run)
        assert_states_match(eager, run)


def test_train_and_eval_exports_are_reused_whichever_ran_first(cache_dir: Path, exports: list[Any]) -> None:
    """ORT's flattened module keeps the output structure of its previous export: the key must not."""
    torch.manual_seed(0)
    model = MLP()
    twin = copy.deepcopy(model)
    strategy = lightning_ort.ORTStrategy(export_cache=True)
    first = fit(model, mlp_loader(), strategy, STEPS, val=mlp_loader(), num_sanity_val_steps=1)  # eval export first
    assert len(exports) == 2
    strategy = lightning_ort.ORTStrategy(export_cache=True)
    second = fit(twin, mlp_loader(), strategy, STEPS, val=mlp_loader())  # training export first
    assert len(exports) == 2, "an export was not reused because another one ran before it"
    assert len(list(cache_dir.iterdir())) == 2
    assert_ort_ran(second, STEPS)
    assert_states_match(first, second)


@pytest.mark.parametrize(
    "change",
    [
        lambda model: setattr(model.body[2], "p", 0.5),  # a Python attribute the trace bakes in
        lambda model: model.train(False) or model.head.train(True),  # another train/eval state
        lambda model: model.body[0].requires_grad_(False),
        lambda model: model.to(torch.float64),
    ],
    ids=["attribute", "train-eval", "requires-grad", "dtype"],
)
def test_what_the_export_depends_on_changes_the_key(cache_dir: Path, exports: list[Any], change: Any) -> None:
    torch.manual_seed(0)
    model = MLP(dropout=0.1)
    other = copy.deepcopy(model)
    change(other)
    _fit(model)
    if other.body[0].weight.dtype == torch.float64:
        return  # float64 parameters with float32 inputs: only the key matters here
    _fit(other)
    assert len(exports) == 2
    assert len(list(cache_dir.iterdir())) == 2


def test_another_version_of_a_loaded_library_changes_the_key(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A library's code is not hashed like the user's (an upgraded transformers would reuse a graph traced
    through its old code): its installed version is part of the key."""
    model, inputs = MLP(), (torch.randn(2, 16),)
    key = export_cache.cache_directory(model, inputs, None, 17, True, False)
    assert export_cache.cache_directory(model, inputs, None, 17, True, False) == key
    monkeypatch.setattr(export_cache, "_version", lambda name: "0.0.1" if name == "numpy" else "same")
    upgraded = export_cache.cache_directory(model, inputs, None, 17, True, False)
    monkeypatch.setattr(export_cache, "_version", lambda name: "0.0.2" if name == "numpy" else "same")
    assert key is not None and upgraded is not None
    assert export_cache.cache_directory(model, inputs, None, 17, True, False) != upgraded


def test_float64_model_gets_its_own_key(cache_dir: Path) -> None:
    module = MLP()
    directory = export_cache.cache_directory(module, [torch.randn(2, 16)], "info", 17, True, False)
    module.to(torch.float64)
    assert export_cache.cache_directory(module, [torch.randn(2, 16)], "info", 17, True, False) != directory
    assert export_cache.cache_directory(module, [torch.randn(2, 16, dtype=torch.float64)], "info", 17, True, False) != (
        export_cache.cache_directory(module, [torch.randn(2, 16)], "info", 17, True, False)
    )


class TemperedCNN(CNN):
    """BatchNorm layers (ORT's graph cannot advance ``num_batches_tracked``; the trace counts their
    calls) and a temperature a schedule changes at step 2 (the trace records the read). An export
    served from the cache runs no trace, so both must come with it."""

    scale = 1.0  # a class attribute: not in the cache key, unlike instance attributes

    def __init__(self) -> None:
        super().__init__()
        self.temperature = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * self.scale / self.temperature

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.temperature = 2.0 if self.global_step >= 2 else 1.0


def _fit_cnn(model: torch.nn.Module, strategy: Any) -> Any:
    return fit(model, image_loader(), strategy, 4)


def test_reused_export_still_sees_attribute_changes_and_counts_batch_norm_calls(
    cache_dir: Path, exports: list[Any]
) -> None:
    torch.manual_seed(0)
    model = TemperedCNN()
    twin, eager_model = copy.deepcopy(model), copy.deepcopy(model)
    eager = _fit_cnn(eager_model, "auto")
    first = _fit_cnn(model, lightning_ort.ORTStrategy(export_cache=True))
    assert len(exports) == 2, "the change of temperature made ORT export again"
    second = _fit_cnn(twin, lightning_ort.ORTStrategy(export_cache=True))
    assert len(exports) == 2, "the second run exported again: both graphs are cached under one key"
    (key,) = cache_dir.iterdir()
    assert len([entry for entry in key.iterdir() if any(entry.glob("*.onnx"))]) == 2
    for run in (first, second):
        assert_losses_match(eager, run)
        assert_states_match(eager, run)  # num_batches_tracked included
        assert_ort_ran(run, 4)


def test_cached_graph_holding_another_value_is_exported_anew(
    cache_dir: Path, exports: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model = TemperedCNN()
    twin, eager_model = copy.deepcopy(model), copy.deepcopy(model)
    fit(model, image_loader(), lightning_ort.ORTStrategy(export_cache=True), 2)
    monkeypatch.setattr(TemperedCNN, "scale", 3.0)  # same key, other constant in the graph
    eager = fit(eager_model, image_loader(), "auto", 2)
    run = fit(twin, image_loader(), lightning_ort.ORTStrategy(export_cache=True, fallback="raise"), 2)
    assert len(exports) == 2, "the cached graph with scale 1.0 was reused"
    assert_ort_ran(run, 2)
    assert_losses_match(eager, run)
    assert_states_match(eager, run)


SCALE = 1.0  # a module-level number HyperCNN's forward names


class HyperCNN(CNN):
    """Divides by a hyper-parameter, an entry of a config dict and a global; ``self.hparams``, the dict and
    globals are in no cache key (the adapter ORT exports keys the LightningModule by its structure)."""

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.config = {"scale": 1.0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) / self.hparams.temperature * self.config["scale"] * SCALE


@pytest.mark.parametrize("change", ["hparams", "config", "global"])
def test_cached_graph_holding_another_hyper_parameter_is_exported_anew(
    cache_dir: Path, exports: list[Any], change: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model = HyperCNN()
    fit(model, image_loader(), lightning_ort.ORTStrategy(export_cache=True), 2)
    torch.manual_seed(0)
    twin = HyperCNN(temperature=2.0 if change == "hparams" else 1.0)
    twin.load_state_dict(model.state_dict())
    if change == "config":
        twin.config["scale"] = 3.0
    if change == "global":
        monkeypatch.setattr(sys.modules[__name__], "SCALE", 3.0)
    eager_model = copy.deepcopy(twin)
    run = fit(twin, image_loader(), lightning_ort.ORTStrategy(export_cache=True, fallback="raise"), 2)
    assert len(exports) == 2, "the cached graph of another value was reused"
    eager = fit(eager_model, image_loader(), "auto", 2)
    assert_ort_ran(run, 2)
    assert_losses_match(eager, run)
    assert_states_match(eager, run)


def test_refused_export_is_never_reused(cache_dir: Path) -> None:
    run = _fit(NoGradInForward(), fullgraph=True)
    (report,) = run.reports
    assert report.fallback_reason is not None
    assert not cache_dir.exists() or not any(cache_dir.iterdir())
    run = _fit(NoGradInForward(), fullgraph=True)
    assert run.reports[0].fallback_reason is not None, "a refused graph came back from the cache"


def test_custom_function_graphs_are_not_cached(cache_dir: Path) -> None:
    run = _fit(STEMLP(), custom_autograd=True)
    assert_ort_ran(run, STEPS)
    assert not cache_dir.exists() or not any(cache_dir.iterdir())


def test_off_by_default_and_validated(cache_dir: Path) -> None:
    fit(MLP(), mlp_loader(), lightning_ort.ORTStrategy(), STEPS)
    assert not cache_dir.exists()
    with pytest.raises(TypeError, match=r"export_cache='yes'.*True or False"):
        lightning_ort.ORTStrategy(export_cache="yes")  # type: ignore[arg-type]


def test_an_entry_another_process_is_exporting_into_is_left_alone(cache_dir: Path, exports: list[Any]) -> None:
    """DDP: every process exports the same model at once; one must not delete the entry another is
    still writing (no graph in it yet), which would fail that process's export."""
    torch.manual_seed(0)
    model = MLP()
    twin = copy.deepcopy(model)
    _fit(model)
    (key,) = cache_dir.iterdir()
    (entry,) = key.iterdir()
    for graph in entry.glob("*.onnx"):
        graph.unlink()  # as while another process exports into it
    run = _fit(twin)
    assert_ort_ran(run, STEPS)
    assert len(exports) == 2 and entry.is_dir(), "the entry being written was removed"
    cached = [path for path in key.iterdir() if any(path.glob("*.onnx"))]
    assert cached and entry not in cached, "the new export went into the entry another process is writing"
