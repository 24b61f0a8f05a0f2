"""Custom torch.autograd.Functions train inside ORT graphs (PythonOp nodes) with eager gradients, or fall back."""

from __future__ import annotations

import copy
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
import pytest
import torch
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit, fit_both
from models import MLP, mlp_loader
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from lightning_ort import ORTSetupError, ORTStrategy, engine
from lightning_ort.adapter import ForwardAdapter
from lightning_ort.engine.bootstrap import custom_function, extensions


class StraightThroughSign(torch.autograd.Function):
    """Sign forward, identity backward: the backward returns ORT's own gradient buffer."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return torch.sign(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class ScaledClamp(torch.autograd.Function):
    """Non-tensor arguments: float, tuple of floats, int, bool and an arbitrary object (a str)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, scale: float, bounds: tuple[float, float], power: int, negate: bool, tag: str
    ) -> torch.Tensor:
        assert tag == "clamp" and isinstance(power, int) and isinstance(negate, bool)
        ctx.scale, ctx.power, ctx.negate = scale, power, negate
        ctx.save_for_backward(x)
        ctx.bounds = bounds
        y = scale * x.clamp(*bounds) ** power
        return -y if negate else y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (x,) = ctx.saved_tensors
        low, high = ctx.bounds
        inside = (x > low) & (x < high)
        local = ctx.scale * ctx.power * x.clamp(low, high) ** (ctx.power - 1) * inside
        return (-grad if ctx.negate else grad) * local, None, None, None, None, None


class ExpScale(torch.autograd.Function):
    """exp(x) * w, saving an input, a parameter and the output for backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        y = torch.exp(x) * weight
        ctx.save_for_backward(x, weight, y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, weight, y = ctx.saved_tensors
        # returned with its batch dimension: the engine reduces it to the weight's shape
        return grad * y, grad * torch.exp(x)


class SplitHalves(torch.autograd.Function):
    """Two outputs with their own gradients (relu of the first half, twice the second)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        first, second = x.chunk(2, dim=-1)
        ctx.save_for_backward(first)
        return first.relu(), second * 2

    @staticmethod
    def backward(ctx: Any, grad_first: torch.Tensor, grad_second: torch.Tensor) -> torch.Tensor:
        (first,) = ctx.saved_tensors
        return torch.cat([grad_first * (first > 0), grad_second * 2], dim=-1)


class WithSymbolic(torch.autograd.Function):
    """An ONNX symbolic replaces the Function in the export: ORT would ignore this backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return torch.sign(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad

    @staticmethod
    def symbolic(g: Any, x: Any) -> Any:
        return g.op("Sign", x)


class STEMLP(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(StraightThroughSign.apply(self.body(x)))


class ClampMLP(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(ScaledClamp.apply(self.body(x), 0.5, (-0.75, 0.75), 2, True, "clamp"))


class ExpMLP(MLP):
    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(ExpScale.apply(self.body(x), self.gain))


class SplitMLP(MLP):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(16, 3)
        self.side = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second = SplitHalves.apply(self.body(x))
        return self.head(first) + self.side(second)


class SplitUnusedMLP(SplitMLP):
    """The second output never reaches the loss: its gradient is materialised as zeros, as in eager."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, _ = SplitHalves.apply(self.body(x))
        return self.head(first)


class SymbolicMLP(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(WithSymbolic.apply(self.body(x)))


MODELS = [STEMLP, ClampMLP, ExpMLP, SplitMLP, SplitUnusedMLP]
IDS = ["straight_through", "non_tensor_args", "save_for_backward", "multiple_outputs", "unused_output"]


@pytest.fixture
def support_on() -> Iterator[None]:
    before = engine.custom_function_support_enabled()
    assert engine.custom_function_support(True)
    yield
    engine.custom_function_support(before)


@pytest.fixture
def support_off() -> Iterator[None]:
    before = engine.custom_function_support_enabled()
    assert not engine.custom_function_support(False)
    yield
    engine.custom_function_support(before)


def python_ops(ort_module: nn.Module) -> list[str]:
    model = engine.exported_model(ort_module, True)
    assert model is not None
    return [
        attribute.s.decode()
        for node in model.graph.node
        if node.op_type == "PythonOp"
        for attribute in node.attribute
        if attribute.name == "func_name"
    ]


@pytest.mark.parametrize("model_cls", MODELS, ids=IDS)
def test_raw_ort_module_matches_eager_losses_and_gradients(support_on: None, model_cls: Callable[[], MLP]) -> None:
    module = model_cls()
    reference = copy.deepcopy(module)
    # ORTModule inspects every attribute of what it wraps; the adapter keeps the LightningModule out of it
    ort = engine.wrap_module(ForwardAdapter.for_module(module), engine.ORTRuntimeOptions(log_level="ERROR"))
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (module, reference)]
    loader = iter(mlp_loader(batch_size=8))
    for _ in range(4):
        x, y = next(loader)
        losses = []
        for model, optimizer in zip((ort, reference), optimizers, strict=True):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
        for (name, param), twin in zip(module.named_parameters(), reference.parameters(), strict=True):
            if twin.grad is None:  # a layer the loss never reaches
                assert param.grad is None, name
                continue
            torch.testing.assert_close(param.grad, twin.grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
        for optimizer in optimizers:
            optimizer.step()
        assert not custom_function._PENDING  # every context was released after its backward
    # one PythonOp per Function application; ORT's own _OutputIdentityOp exports as Identity
    function = {STEMLP: StraightThroughSign, ClampMLP: ScaledClamp, ExpMLP: ExpScale}.get(model_cls, SplitHalves)
    assert python_ops(ort) == [custom_function.qualified_name(function)]


@pytest.mark.parametrize("model_cls", MODELS, ids=IDS)
def test_trainer_trains_custom_functions_in_ort_like_eager(support_on: None, model_cls: Callable[[], MLP]) -> None:
    eager, ort = fit_both(model_cls, mlp_loader, 8, val=mlp_loader(n=64), val_check_interval=4)
    assert_ort_ran(ort, min_calls=8)
    (report,) = ort.reports
    assert report.fallback_reason is None and report.ort_calls == 8 + 2 * 2  # 8 steps, 2 validations of 2 batches
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    # the validation steps ran ORT's inference graph, with the Function in it too
    assert ort.trainer.callback_metrics["val_loss"] == pytest.approx(float(eager.trainer.callback_metrics["val_loss"]))


class GraphProbe(L.Callback):
    """Reads the PythonOp nodes of the strategy's ORT graph while training runs."""

    def __init__(self) -> None:
        self.python_ops: list[str] = []

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.python_ops = python_ops(trainer.strategy.ort_modules["forward"])


def test_exported_graph_keeps_the_function_through_the_strategy(support_on: None) -> None:
    probe = GraphProbe()
    result = fit(STEMLP(), mlp_loader(), "ort", max_steps=2, callbacks=[probe])
    assert result.reports[0].ort_calls == 2 and result.reports[0].fallback_reason is None
    assert probe.python_ops == [custom_function.qualified_name(StraightThroughSign)]


def test_support_off_falls_back_with_the_reason(support_off: None) -> None:
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        eager, ort = fit_both(STEMLP, mlp_loader, 4, strategy=ORTStrategy(fullgraph=True, custom_autograd=False))
    (report,) = ort.reports
    assert report.fallback_reason is not None
    assert "custom torch.autograd.Function(s) test_custom_function.StraightThroughSign" in report.fallback_reason
    assert "custom autograd.Function support is off" in report.fallback_reason
    assert report.ort_calls == 0
    assert sum("lightning_ort: ORT cannot run" in str(r.message) for r in records) == 1
    assert_losses_match(eager, ort, rtol=0)


def test_symbolic_functions_still_fall_back(support_on: None) -> None:
    eager, ort = fit_both(SymbolicMLP, mlp_loader, 4, strategy=ORTStrategy(fullgraph=True))
    (report,) = ort.reports
    assert report.fallback_reason is not None
    assert "test_custom_function.WithSymbolic were exported as ONNX operators" in report.fallback_reason
    assert_losses_match(eager, ort, rtol=0)


class AddOneInPlace(torch.autograd.Function):
    """In place on its input (ctx.mark_dirty), with a backward that is not the true gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 3


class NoMaterializedGrads(torch.autograd.Function):
    """ctx.set_materialize_grads(False): the unused output's gradient arrives as None."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        return x * 2, x * 3

    @staticmethod
    def backward(ctx: Any, first: torch.Tensor | None, second: torch.Tensor | None) -> torch.Tensor:
        assert second is None
        return first * 2


class Layered(nn.Module):
    def __init__(self, apply: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 8)
        self.apply_function = apply

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply_function(self.layer(x))


@pytest.mark.parametrize(
    "apply",
    [lambda h: AddOneInPlace.apply(h * 1), lambda h: NoMaterializedGrads.apply(h)[0]],
    ids=["mark_dirty", "materialize_grads_off"],
)
def test_context_features_match_eager(support_on: None, apply: Callable[[torch.Tensor], torch.Tensor]) -> None:
    module = Layered(apply)
    reference = copy.deepcopy(module)
    ort = engine.wrap_module(module, engine.ORTRuntimeOptions(log_level="ERROR"))
    x = torch.randn(4, 8)
    out, expected = ort(x), reference(x)
    torch.testing.assert_close(out, expected)
    out.pow(2).sum().backward()
    expected.pow(2).sum().backward()
    for param, twin in zip(module.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(param.grad, twin.grad, rtol=1e-4, atol=1e-6)
    assert len(python_ops(ort)) == 1


class CheckpointMLP(MLP):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self.body, x, use_reentrant=self.reentrant))


def test_non_reentrant_checkpoint_trains_in_ort(support_on: None) -> None:
    eager, ort = fit_both(lambda: CheckpointMLP(reentrant=False), mlp_loader, 4)
    assert_ort_ran(ort, min_calls=4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class CheckpointedBatchNorm(MLP):
    """``checkpoint_sequential`` over layers with a BatchNorm (in training mode unless ``frozen_norm``): the
    first of two segments, which holds the BatchNorm, is checkpointed."""

    def __init__(self, frozen_norm: bool) -> None:
        super().__init__()
        self.blocks = nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 16))
        self.frozen_norm = frozen_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.frozen_norm:
            self.blocks[1].eval()
        return self.head(self.body(checkpoint_sequential(self.blocks, 2, x, use_reentrant=False)))


def test_running_statistics_in_a_non_reentrant_checkpoint_fall_back(support_on: None) -> None:
    """Eager updates them twice per step (again when recomputing in backward), ORT's graph once."""
    eager, ort = fit_both(
        lambda: CheckpointedBatchNorm(frozen_norm=False), mlp_loader, 4, strategy=ORTStrategy(fullgraph=True)
    )
    (report,) = ort.reports
    assert report.fallback_reason is not None and "blocks.1 update running statistics inside" in report.fallback_reason
    assert_states_match(eager, ort)  # running statistics and num_batches_tracked (8) included
    eager, ort = fit_both(
        lambda: CheckpointedBatchNorm(frozen_norm=True), mlp_loader, 4, strategy=ORTStrategy(fullgraph=True)
    )
    assert_ort_ran(ort, min_calls=4)
    assert_states_match(eager, ort)


@pytest.mark.parametrize("support", [True, False], ids=["support_on", "support_off"])
def test_reentrant_checkpoint_falls_back_with_the_fix(support: bool) -> None:
    before = engine.custom_function_support_enabled()
    engine.custom_function_support(support)
    try:
        eager, ort = fit_both(
            lambda: CheckpointMLP(reentrant=True),
            mlp_loader,
            3,
            strategy=ORTStrategy(fullgraph=True, custom_autograd=support),
        )
    finally:
        engine.custom_function_support(before)
    (report,) = ort.reports
    assert report.fallback_reason is not None and "use_reentrant=False" in report.fallback_reason
    assert_losses_match(eager, ort, rtol=0)


def _function_named_twin(sign: float) -> type[torch.autograd.Function]:
    class Twin(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * sign

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            return grad * sign

    return Twin


class TwinUser(nn.Module):
    def __init__(self, function: type[torch.autograd.Function]) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)
        self.function = function

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function.apply(self.layer(x))


def test_a_redefined_function_with_a_known_name_is_refused(support_on: None) -> None:
    first = engine.wrap_module(TwinUser(_function_named_twin(1.0)), engine.ORTRuntimeOptions(log_level="ERROR"))
    first(torch.randn(2, 4)).sum().backward()
    second = engine.wrap_module(TwinUser(_function_named_twin(-1.0)), engine.ORTRuntimeOptions(log_level="ERROR"))
    with pytest.raises(Exception, match="ORT already runs in this process"):
        second(torch.randn(2, 4))


def test_unbuildable_extension_leaves_everything_else_working(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    before = engine.custom_function_support_enabled()
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(extensions.CACHE_ENV, str(blocker / "cache"))
    monkeypatch.setattr(custom_function, "_runner_module", None)
    monkeypatch.delitem(sys.modules, extensions.CUSTOM_FUNCTION_RUNNER, raising=False)
    monkeypatch.setattr(custom_function, "_unavailable_reason", None)
    try:
        with pytest.raises(ORTSetupError, match="Custom autograd.Function support inside ORT is unavailable"):
            engine.custom_function_support(True)
        assert engine.custom_function_support(None) is False
        eager, ort = fit_both(STEMLP, mlp_loader, 3, strategy=ORTStrategy(fullgraph=True))
        (report,) = ort.reports
        assert report.fallback_reason is not None
        assert "custom autograd.Function support is unavailable: Cannot create the extension cache directory" in (
            report.fallback_reason
        )
        assert_losses_match(eager, ort, rtol=0)
        # modules without custom Functions still run in ORT
        eager, ort = fit_both(MLP, mlp_loader, 3, strategy=ORTStrategy(fullgraph=True))
        assert_ort_ran(ort, min_calls=3)
    finally:
        monkeypatch.undo()
        engine.custom_function_support(before)


def test_switching_never_leaves_environment_changes() -> None:
    before = dict(os.environ)
    state = engine.custom_function_support_enabled()
    assert engine.custom_function_support(True) is True
    assert engine.custom_function_support(False) is False
    assert engine.custom_function_support(None) is True
    engine.custom_function_support(state)
    assert dict(os.environ) == before


def test_runner_is_built_into_the_cache_not_site_packages() -> None:
    path, _ = extensions.build_custom_function_runner()
    assert path.is_relative_to(extensions.cache_root())
    assert not path.is_relative_to(sys.prefix)


def test_the_runner_is_loaded_by_the_first_export_that_needs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # On a fresh machine the strategy starts with the runner unbuilt (a model without custom Functions
    # never compiles it, test_extension_cache.py); the export that finds a custom Function loads it.
    before = engine.custom_function_support_enabled()
    monkeypatch.setattr(extensions, "custom_function_runner_built", lambda: False)
    monkeypatch.setattr(custom_function, "_runner_module", None)
    monkeypatch.setattr(custom_function, "_unavailable_reason", None)
    try:
        eager, ort = fit_both(STEMLP, mlp_loader, 3)
        assert custom_function._runner_module is not None
        assert_ort_ran(ort, min_calls=3)
        assert_losses_match(eager, ort)
    finally:
        monkeypatch.undo()
        engine.custom_function_support(before)
