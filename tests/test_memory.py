"""ORT's memory optimizer levels: same losses as level 0, clear errors, nothing leaks between runs."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import RunResult, assert_losses_match, assert_ort_ran, fit, fit_both
from models import MLP, mlp_loader
from test_gpt import char_loader, make_gpt

from lightning_ort import ORTStrategy, engine


def fit_recording_levels(strategy: ORTStrategy, steps: int = 12) -> RunResult:
    """Train the example GPT, recording the memory optimization level ORT's graph uses at each step."""
    levels: list[int] = []
    plans: list[list[str]] = []

    class Probe(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
            levels.append(engine.memory_optimization_level(trainer.strategy.ort_modules["forward"]))
            plans.append(engine.recompute_plans(trainer.strategy.ort_modules["forward"]))

    torch.manual_seed(0)
    result = fit(make_gpt(), char_loader(), strategy, max_steps=steps, callbacks=[Probe()])
    result.levels = levels  # type: ignore[attr-defined]
    result.plans = plans  # type: ignore[attr-defined]
    return result


@pytest.mark.parametrize("level", [1, 2])
def test_recompute_levels_train_to_the_same_losses_as_level_0(level: int) -> None:
    base = fit_recording_levels(ORTStrategy())
    recompute = fit_recording_levels(ORTStrategy(memory_optimization_level=level))
    assert_ort_ran(recompute, 12)
    assert set(recompute.levels) == {level} and set(base.levels) == {0}
    # ORT found the transformer blocks' recomputable subgraphs and applies them; level 0 has no plans
    assert any("Gelu+" in plan for plan in recompute.plans[-1]) and base.plans[-1] == []
    assert_losses_match(base, recompute)


def test_explicit_op_rewrites_with_a_memory_level_warns_that_recompute_covers_less() -> None:
    with pytest.warns(UserWarning, match=r"op_rewrites=True\) runs linear layers.*cannot recompute"):
        ORTStrategy(op_rewrites=True, memory_optimization_level=1)
    recompute = fit_recording_levels(ORTStrategy(op_rewrites=True, memory_optimization_level=1), steps=2)
    assert_ort_ran(recompute, 2)
    # the transformer blocks' GELU now runs on torch's kernel, so ORT finds no GELU subgraph to recompute
    assert not any("Gelu+" in plan for plan in recompute.plans[-1])


def test_level_does_not_leak_into_the_next_run() -> None:
    fit_recording_levels(ORTStrategy(memory_optimization_level=1), steps=2)
    after = fit_recording_levels(ORTStrategy(), steps=2)
    assert set(after.levels) == {0}


def test_user_plans_at_level_0(tmp_path: Path) -> None:
    config = tmp_path / "plans.json"
    config.write_text(json.dumps(["Gelu+:1:-1"]))
    eager, ort = fit_both(MLP, mlp_loader, 6, strategy=ORTStrategy(memory_optimizer_config=str(config)))
    assert_ort_ran(ort, 6)
    assert_losses_match(eager, ort)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"memory_optimization_level": 3}, "memory_optimization_level=3) must be 0"),
        ({"memory_optimization_level": "1"}, "memory_optimization_level='1') must be 0"),
        ({"memory_optimizer_config": "/nonexistent/plans.json"}, "no such file"),
    ],
)
def test_bad_memory_options_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ORTStrategy(**kwargs)


def test_malformed_config_is_rejected(tmp_path: Path) -> None:
    config = tmp_path / "plans.json"
    config.write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        ORTStrategy(memory_optimizer_config=str(config))
    config.write_text(json.dumps(["Gelu+"]))
    with pytest.raises(ValueError, match="'Gelu\\+' is not a recompute plan"):
        ORTStrategy(memory_optimizer_config=str(config))


def test_config_with_level_1_warns_that_ort_ignores_it(tmp_path: Path) -> None:
    config = tmp_path / "plans.json"
    config.write_text(json.dumps(["Gelu+:1:-1"]))
    with pytest.warns(UserWarning, match="memory_optimizer_config is ignored at memory_optimization_level=1"):
        ORTStrategy(memory_optimization_level=1, memory_optimizer_config=str(config))
