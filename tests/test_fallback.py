"""Modules ORT would train wrongly or cannot export: PyTorch takes over with one warning, or the run stops."""

from __future__ import annotations

import dataclasses
import enum
import subprocess
import sys
import types
import warnings
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
import torchmetrics
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit, fit_both
from models import (
    CNN,
    MLP,
    BackwardHooked,
    BufferCopier,
    BufferReplacer,
    BufferWriter,
    DataDependent,
    GradSwitchedOff,
    HookedFeatures,
    InPlaceInput,
    MaxNormEmbedding,
    NoGradInForward,
    PerSampleLoop,
    PythonCounter,
    RequiresGradBranch,
    SparseEmbedding,
    STEModel,
    StoredAuxLoss,
    TensorHookInForward,
    image_loader,
    mlp_loader,
)
from torch import nn

from lightning_ort import ORTFallbackError, ORTStrategy, fallback_reasons

CASES = [
    (STEModel, "custom torch.autograd.Function(s) models.StraightThrough"),
    (DataDependent, "control flow or values that depend on tensor data"),
    (BufferWriter, "updates buffer(s) counter.calls in place"),
    (BufferCopier, "updates buffer(s) running in place"),
    (NoGradInForward, "its forward turns gradients off (torch.no_grad() at"),
    (GradSwitchedOff, "its forward turns gradients off with set_grad_enabled(False) or inference_mode at"),
    (PythonCounter, "its forward changes Python attribute(s) self.calls"),
    (PerSampleLoop, "into a Python integer at"),
    (BufferReplacer, "assigns new tensors to buffer(s) mean"),
    (MaxNormEmbedding, "changes parameter(s) embedding.weight in place"),
    (SparseEmbedding, "embedding layer(s) embedding use sparse=True"),
    (HookedFeatures, "forward hooks are registered on submodule(s) body"),
    (InPlaceInput, "its forward changes an input tensor in place"),
    (BackwardHooked, "backward hooks are registered on submodule(s) head"),
    (TensorHookInForward, "the forward registers a gradient hook on a tensor"),
    (RequiresGradBranch, "its forward reads Tensor.requires_grad at"),
    (StoredAuxLoss, "its forward stores tensor(s) self.aux_loss"),
]
IDS = [
    "autograd_function", "data_dependent", "buffer_write", "buffer_copy", "no_grad", "grad_switched_off",
    "python_state", "shape_loop", "buffer_replaced", "max_norm", "sparse_embedding", "forward_hook", "in_place_input",
    "backward_hook", "tensor_hook", "requires_grad_branch", "stored_tensor",
]  # fmt: skip


@pytest.mark.parametrize(("model_cls", "reason"), CASES, ids=IDS)
def test_warn_once_and_train_like_eager(model_cls: type, reason: str) -> None:
    """``fullgraph=True``: the module runs in PyTorch as a whole."""
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        strategy = ORTStrategy(custom_autograd=False, fullgraph=True)
        eager, ort = fit_both(model_cls, mlp_loader, 12, strategy=strategy)
    ours = [str(r.message) for r in records if "lightning_ort: ORT cannot run" in str(r.message)]
    assert len(ours) == 1, ours
    assert "`forward`" in ours[0] and reason in ours[0]
    (report,) = ort.reports
    assert report.fallback_reason is not None and reason in report.fallback_reason
    assert report.ort_calls == 0 and report.torch_calls == 12
    # PyTorch trained it: exactly the eager result, custom backward and buffer updates included
    assert_losses_match(eager, ort, rtol=0)
    assert_states_match(eager, ort, atol=0, rtol=0)


# Submodules that keep the refusal themselves stay in PyTorch (hooks on a submodule itself run around its
# ORT graph, as module hooks run around forward, so only hooks on *its* submodules refuse it)
_REFUSED_CHILDREN = {"max_norm": {"embedding"}, "sparse_embedding": {"embedding"}}


@pytest.mark.parametrize(("model_cls", "reason"), CASES, ids=IDS)
def test_graph_break_trains_the_submodules_in_ort(model_cls: type, reason: str) -> None:
    """By default a refused forward is a graph break: its submodules run in ORT, the code between them in
    PyTorch, with eager's results; one warning names the submodules and the reason."""
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        eager, ort = fit_both(model_cls, mlp_loader, 12, strategy=ORTStrategy(custom_autograd=False))
    ours = [str(r.message) for r in records if "lightning_ort: ORT cannot run" in str(r.message)]
    assert "`forward`" in ours[0] and reason in ours[0] and "ORT runs its submodules" in ours[0], ours
    forward, *children = ort.reports
    assert forward.fallback_reason is not None and reason in forward.fallback_reason
    assert forward.submodules == [report.name for report in children] and children
    refused = _REFUSED_CHILDREN.get(IDS[CASES.index((model_cls, reason))], set())
    for report in children:
        if report.name in refused:
            assert report.fallback_reason is not None and report.ort_calls == 0, report
        else:
            assert report.fallback_reason is None and report.ort_calls >= 12, report
    share = ort.trainer.strategy.ort_parameter_share
    assert share is not None and 0 < share < 1 if refused else share == 1
    assert_losses_match(eager, ort, rtol=1e-5)
    assert_states_match(eager, ort)


@pytest.mark.parametrize(("model_cls", "reason"), CASES, ids=IDS)
def test_raise_stops_with_reason(model_cls: type, reason: str) -> None:
    with pytest.raises(ORTFallbackError, match="ORT cannot run `forward`") as info:
        fit(model_cls(), mlp_loader(), ORTStrategy(fallback="raise", custom_autograd=False), max_steps=2)
    assert reason in str(info.value)
    assert "fallback='warn'" in str(info.value)


TEMPERATURE = 1.0  # a module-level number Schedule changes
SCHEDULE = {"temperature": 1.0}  # and a module-level dict


class Mode(enum.Enum):
    SOFT = 1
    SHARP = 2


@dataclasses.dataclass
class Config:
    temperature: float = 1.0


class PlainConfig:
    def __init__(self) -> None:
        self.temperature = 1.0


_CONFIGS = {
    "config-dict": lambda: {"temperature": 1.0},
    "config-nested": lambda: {"schedule": {"temperature": 1.0}},
    "config-dataclass": Config,
    "config-object": PlainConfig,
}


class Scheduled(MLP):
    """Scales its output by a value that changes every step: the global step (read from the module or its
    trainer), a number a callback sets (an attribute, a hyper-parameter, a config's entry), or a plain
    tensor attribute (not a buffer) a callback fills."""

    def __init__(self, source: str, temperature: float = 1.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.source = source
        self.temperature = temperature
        self.scale = torch.ones(())
        self.config = _CONFIGS.get(source, lambda: types.SimpleNamespace(temperature=1.0))()
        self.mode, self.emode, self.maybe = "soft", Mode.SOFT, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        factors: dict[str, Any] = {
            "global_step": lambda: 1.0 + 0.1 * self.global_step,
            "trainer": lambda: 1.0 + 0.1 * self.trainer.global_step,
            "attribute": lambda: self.temperature,
            "hparams": lambda: self.hparams.temperature,
            "hparams-item": lambda: self.hparams["temperature"],
            "config-dict": lambda: self.config["temperature"],
            "config-namespace": lambda: self.config.temperature,
            "config-nested": lambda: self.config["schedule"]["temperature"],
            "config-dataclass": lambda: self.config.temperature,
            "config-object": lambda: self.config.temperature,
            "mode-string": lambda: 1.0 if self.mode == "soft" else 1.5,
            "mode-enum": lambda: 1.0 if self.emode is Mode.SOFT else 1.5,
            "maybe-none": lambda: 1.0 if self.maybe is None else self.maybe,
            "getattr-default": lambda: getattr(self, "late", 1.0),
            "global": lambda: TEMPERATURE,
            "global-dict": lambda: SCHEDULE["temperature"],
            "tensor": lambda: self.scale,
        }
        return self.head(self.body(x)) * factors[self.source]()


class Schedule(L.Callback):
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, index: int) -> None:
        pl_module.temperature = pl_module.hparams.temperature = 1.0 + 0.1 * index
        pl_module.scale.fill_(1.0 + 0.1 * index)
        if pl_module.source == "global":  # forward names it in every case: changed, it hands any to PyTorch
            global TEMPERATURE
            TEMPERATURE = 1.0 + 0.1 * index
        if pl_module.source == "global-dict":
            SCHEDULE["temperature"] = 1.0 + 0.1 * index
        if isinstance(pl_module.config, dict):
            inner = pl_module.config.get("schedule", pl_module.config)
            inner["temperature"] = 1.0 + 0.1 * index
        else:
            pl_module.config.temperature = 1.0 + 0.1 * index
        if index >= 1:  # the export (at index 0) saw the first values; an attribute "late" missing
            pl_module.mode, pl_module.emode, pl_module.maybe = "sharp", Mode.SHARP, 1.0 + 0.1 * index
            pl_module.late = 1.0 + 0.1 * index


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("global_step", "reads self.global_step, which was 1 when ORT exported the graph and is 2 now"),
        ("trainer", "reads self.trainer.global_step, which was 1 when ORT exported the graph and is 2 now"),
        ("attribute", "reads self.temperature, which was 1.1 when ORT exported the graph and is 1.2"),
        ("hparams", "reads self.hparams.temperature, which was 1.1 when ORT exported the graph and is 1.2"),
        ("hparams-item", "reads self.hparams.temperature, which was 1.1 when ORT exported the graph and is 1.2"),
        ("config-dict", "reads self.config, whose values changed after ORT exported the graph"),
        ("config-namespace", "reads self.config, whose values changed after ORT exported the graph"),
        ("config-nested", "reads self.config, whose values changed after ORT exported the graph"),
        ("config-dataclass", "reads self.config, whose values changed after ORT exported the graph"),
        ("config-object", "reads self.config, whose values changed after ORT exported the graph"),
        ("mode-string", "reads self.mode, which was 'soft' when ORT exported the graph and is 'sharp' now"),
        ("mode-enum", "reads self.emode, which was '<test_fallback.Mode.SOFT>' when ORT exported the graph"),
        ("maybe-none", "reads self.maybe, which was 1.1 when ORT exported the graph and is 1.2"),
        ("getattr-default", "reads self.late, which was 1.1 when ORT exported the graph and is 1.2"),
        ("global", "reads the global test_fallback.TEMPERATURE, which was 1.1 when ORT exported the graph and is 1.2"),
        ("global-dict", "reads the global test_fallback.SCHEDULE, whose values changed after ORT exported the graph"),
        ("tensor", "reads the plain tensor attribute self.scale, which changed after ORT exported the graph"),
    ],
)
def test_values_read_by_the_export_that_change_are_followed(source: str, reason: str) -> None:
    """A changed value makes ORT export again; one that changes on every step hands the module to PyTorch
    at its second change (the mode strings change once, at step 1, and stay in ORT)."""
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        eager, ort = fit_both(
            lambda: Scheduled(source), mlp_loader, 6, callbacks=[Schedule()], strategy=ORTStrategy(fullgraph=True)
        )
    ours = [str(r.message) for r in records if "lightning_ort: ORT cannot run" in str(r.message)]
    (report,) = ort.reports
    if source.startswith("mode-"):
        assert not ours
        assert_ort_ran(ort, 6)
    else:
        assert len(ours) == 1 and reason in ours[0] and "changed again within 10 calls" in ours[0], ours
        assert report.ort_calls == 2 and report.torch_calls == 4
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


_PLUGIN = """
import torch
SCALE = 3.0
class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 3)
    def forward(self, x):
        return self.linear(x) * SCALE
"""


class PluginModel(L.LightningModule):
    """A model whose layer comes from a file run with ``importlib`` and never registered in ``sys.modules``
    (a plugin loader): its global ``SCALE`` was read again from ``sys.modules`` and found missing, so ORT gave
    the module up at the second step; a change there went unseen."""

    def __init__(self, plugin: types.ModuleType, change_at: int | None) -> None:
        super().__init__()
        self.set_scale = lambda value: setattr(plugin, "SCALE", value)  # deep copies keep the same module
        self.change_at = change_at
        self.inner = plugin.Scaled()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.set_scale(0.5 if self.change_at is not None and batch_idx >= self.change_at else 3.0)
        return F.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("change_at", [None, 2])
def test_globals_of_a_module_outside_sys_modules_are_read_where_forward_reads_them(
    tmp_path: Any, change_at: int | None
) -> None:
    import importlib.util

    (tmp_path / "plugin_layers.py").write_text(_PLUGIN)
    spec = importlib.util.spec_from_file_location("plugin_layers", tmp_path / "plugin_layers.py")
    assert spec is not None and spec.loader is not None
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    eager, ort = fit_both(lambda: PluginModel(plugin, change_at), mlp_loader, 5, strategy=ORTStrategy(fallback="warn"))
    # read from sys.modules, the global was missing: ORT exported again, then gave the module up
    assert_ort_ran(ort, 5)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_reason_keeps_what_ort_says_went_wrong() -> None:
    check = RuntimeError(
        "/onnxruntime_src/orttraining/core/graph/gradient_builder_registry.cc:29 onnxruntime::training::GradientDef "
        "onnxruntime::training::GetGradientForOp(const GradientGraphConfiguration&, onnxruntime::Graph*) "
        "gradient_builder != nullptr was false. The gradient builder has not been registered: ReduceProd for node X"
    )
    assert (
        fallback_reasons.reason(check)
        == "RuntimeError: The gradient builder has not been registered: ReduceProd for node X"
    )
    export = RuntimeError(
        "There was an error while exporting the PyTorch model to ONNX: \n"
        "Traceback (most recent call last):\n"
        '  File "exporter.py", line 1, in export\n'
        "    raise exception\n"
        "torch.onnx.errors.SymbolicValueError: Expected node type 'onnx::Constant' for argument 'rounding_mode'\n"
        "    )  (type 'Tensor')\n"
    )
    assert fallback_reasons.reason(export).endswith(
        "... torch.onnx.errors.SymbolicValueError: Expected node type 'onnx::Constant' for argument 'rounding_mode'"
    )


class Unpooled(CNN):
    """SegNet-style max pooling with indices, then unpooling: torch's size check fails under the export."""

    def __init__(self) -> None:
        super().__init__()
        self.pool, self.unpool = nn.MaxPool2d(2, return_indices=True), nn.MaxUnpool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled, indices = self.pool(x)
        return super().forward(self.unpool(pooled, indices))


def test_unpooling_falls_back_with_what_the_error_means() -> None:
    eager, ort = fit_both(Unpooled, image_loader, 2, strategy=ORTStrategy(fullgraph=True))
    (report,) = ort.reports
    assert report.fallback_reason is not None and "F.max_unpool2d's output size check" in report.fallback_reason
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class ComplexRotation(MLP):
    """Rotary embeddings in their complex form (LLaMA's reference code): pairs of features rotated by unit
    complex numbers, computed in ``forward`` or kept in a buffer."""

    def __init__(self, kept: bool) -> None:
        super().__init__()
        self.kept = kept
        self.register_buffer("angles", torch.polar(torch.ones(16), torch.arange(16) * 0.1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        angles = self.angles if self.kept else torch.polar(torch.ones(16), torch.arange(16) * 0.1)
        rotated = torch.view_as_real(torch.view_as_complex(h.reshape(h.shape[0], -1, 2)) * angles)
        return self.head(rotated.flatten(1))


@pytest.mark.parametrize("kept", [True, False], ids=["buffer", "computed"])
def test_complex_tensors_fall_back_naming_the_real_rotation(kept: bool) -> None:
    eager, ort = fit_both(lambda: ComplexRotation(kept), mlp_loader, 2, strategy=ORTStrategy(fullgraph=True))
    (report,) = ort.reports
    assert report.fallback_reason is not None and "rotate_half" in report.fallback_reason, report.fallback_reason
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class OutsideParameters(MLP):
    """A forward that uses parameters the module does not hold: a scalar of another module reached through a
    closure (torch's tracer broke on it, and the process died with SIGSEGV), and one in a Python list."""

    def __init__(self, holder: str) -> None:
        super().__init__()
        self.holder = holder
        owner = nn.Module()
        owner.scale = nn.Parameter(torch.tensor(0.7))
        self.scaled = lambda h: h * owner.scale
        self.listed = [nn.Parameter(torch.full((3,), 0.5))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return self.scaled(out) if self.holder == "closure" else out * self.listed[0]


@pytest.mark.parametrize("holder", ["closure", "list"])
def test_parameters_outside_the_module_fall_back_with_the_fix(holder: str) -> None:
    eager, ort = fit_both(
        lambda: OutsideParameters(holder), mlp_loader, 3, strategy=ORTStrategy(fullgraph=True, fallback="warn")
    )
    (report,) = ort.reports
    reason = report.fallback_reason
    assert reason is not None and "nn.ParameterList" in reason and report.torch_calls == 3, reason
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class SpectralNormalised(MLP):
    def __init__(self) -> None:
        super().__init__()
        nn.utils.parametrizations.spectral_norm(self.body[0])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", F.cross_entropy(self(batch[0]), batch[1]))


def test_spectral_norm_falls_back_with_the_reason_and_validates_like_eager() -> None:
    """Its power iteration writes ``_u`` and ``_v`` in place each training forward (the export failed on it
    with "Expected node type 'onnx::Constant' for argument 'rounding_mode'")."""
    eager, ort = fit_both(
        SpectralNormalised, mlp_loader, 3, val=mlp_loader(), val_check_interval=3, strategy=ORTStrategy(fullgraph=True)
    )
    (report,) = ort.reports
    assert report.fallback_reason is not None and "spectral_norm parametrization" in report.fallback_reason
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)  # _u and _v included
    val_loss = float(eager.trainer.callback_metrics["val_loss"])
    assert float(ort.trainer.callback_metrics["val_loss"]) == pytest.approx(val_loss, rel=1e-5)


class EnableGradInForward(MLP):
    """``torch.enable_grad()`` inside forward (torch.distributions' lazy properties do this): gradients flow
    there as everywhere in ORT's graph. The export traces with gradients off, and leaving the block turned
    them off again, which was taken for a ``no_grad`` region."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            hidden = self.body(x)
        return self.head(hidden) + 0.1 * torch.distributions.Categorical(logits=self.head(hidden)).entropy()[:, None]


def test_enable_grad_inside_forward_trains_in_ort() -> None:
    eager, ort = fit_both(EnableGradInForward, mlp_loader, 4)
    (report,) = ort.reports
    assert report.fallback_reason is None and report.ort_calls == 4
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class Distilled(MLP):
    """A teacher inside forward whose output is detached: frozen, ORT leaves it out of the gradient graph;
    trainable, it reaches the loss only through the detach, so its gradients are None (ORT refused it)."""

    def __init__(self, frozen: bool) -> None:
        super().__init__()
        self.teacher = nn.Linear(16, 3)
        self.teacher.requires_grad_(not frozen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.body(x))
        return logits + F.mse_loss(logits, self.teacher(x).detach())


def test_a_frozen_teacher_inside_forward_trains_in_ort() -> None:
    eager, ort = fit_both(lambda: Distilled(frozen=True), mlp_loader, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_a_trainable_parameter_reached_only_through_detach_gets_no_gradient_as_in_eager() -> None:
    eager, ort = fit_both(lambda: Distilled(frozen=False), mlp_loader, 2)
    assert_ort_ran(ort, 2)
    assert ort.model.teacher.weight.grad is None and eager.model.teacher.weight.grad is None
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class DropoutThenSpectrum(L.LightningModule):
    """Dropout, then an op ORT cannot export (``torch.fft``): the module falls back to PyTorch."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.5)
        self.b = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.tanh(self.a(x)))
        return self.b(torch.fft.irfft(torch.fft.rfft(h, dim=-1), n=16, dim=-1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y) + 0.01 * torch.rand(()).item()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_failed_export_leaves_the_random_numbers_of_eager() -> None:
    """The export's trace draws dropout masks; after a failed export the generator is put back, so PyTorch's
    calls draw what the run without ORT draws (the masks differed, and every later random number)."""
    torch.manual_seed(0)
    model = DropoutThenSpectrum()
    twin = DropoutThenSpectrum()
    twin.load_state_dict(model.state_dict())
    torch.manual_seed(1)
    eager = fit(model, mlp_loader(), "auto", 6)
    torch.manual_seed(1)
    ort = fit(twin, mlp_loader(), ORTStrategy(fullgraph=True, fallback="warn"), 6)
    (report,) = ort.reports
    assert report.fallback_reason is not None and "fft" in report.fallback_reason
    assert_losses_match(eager, ort, rtol=0)
    assert_states_match(eager, ort, atol=0, rtol=0)


_FAILED_EXPORT = """
import lightning as L, torch, lightning_ort
from torch.utils.data import DataLoader, TensorDataset
class Spectrum(L.LightningModule):
    def __init__(self):
        super().__init__(); self.layer = torch.nn.Linear(4, 4)
    def forward(self, x): return torch.fft.irfft(torch.fft.rfft(self.layer(x), dim=-1), n=4, dim=-1)
    def training_step(self, batch, i): return self(batch[0]).pow(2).mean()
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.1)
trainer = L.Trainer(strategy=lightning_ort.ORTStrategy(fallback="warn"), max_steps=2, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Spectrum(), DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4))
print("PyTorch calls:", trainer.strategy.ort_reports[0].torch_calls)
"""


def test_a_failed_export_logs_no_torchscript_graph() -> None:
    """torch prints its whole graph when the export fails, and ORT logged what it captured as a warning
    (in a process whose output has file descriptors: pytest's capture has none, so a subprocess)."""
    result = subprocess.run([sys.executable, "-c", _FAILED_EXPORT], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "PyTorch calls: 2" in result.stdout
    assert "aten::fft_rfft" in result.stderr  # the fallback's reason
    assert "(torch's graph at the failure left out)" in result.stderr
    assert "Torch IR graph" not in result.stderr and "graph(%" not in result.stderr


class LayerDrop(MLP):
    """fairseq-style LayerDrop: the hidden layer is skipped at random, drawn with Python or NumPy."""

    def __init__(self, source: str) -> None:
        super().__init__()
        self.source = source

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import random

        import numpy as np

        draw = random.random() if self.source == "random" else np.random.random()
        h = self.body[0](x)
        return self.head(h if draw < 0.5 else self.body[1:](h))


@pytest.mark.parametrize("source", ["random", "numpy"])
def test_python_random_numbers_in_forward_fall_back(source: str) -> None:
    """The export kept the first draw, and ORT took the same branch at every step."""
    import random

    import numpy as np

    results = []
    torch.manual_seed(0)
    model = LayerDrop(source)
    for strategy in ("auto", ORTStrategy(fullgraph=True, fallback="warn")):
        random.seed(0)
        np.random.seed(0)
        twin = LayerDrop(source)
        twin.load_state_dict(model.state_dict())
        results.append(fit(twin, mlp_loader(), strategy, 8))
    eager, ort = results
    (report,) = ort.reports
    assert report.fallback_reason is not None and "draws a Python or NumPy random number" in report.fallback_reason
    assert_losses_match(eager, ort, rtol=0)
    assert_states_match(eager, ort, atol=0, rtol=0)


class CarriedMemory(L.LightningModule):
    """Transformer-XL / truncated-BPTT style: forward keeps its detached output on the module, in a container,
    and adds it to the next call's input. ORT trained as if the memory stayed as the export left it."""

    def __init__(self, holder: str) -> None:
        super().__init__()
        self.holder = holder
        self.layer = nn.Linear(16, 16)
        self.head = nn.Linear(16, 3)
        self.memory: Any = [] if holder == "append" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        previous = self.memory[-1] if self.holder == "append" and self.memory else None
        if self.holder != "append" and self.memory is not None:
            previous = self.memory["h"] if self.holder == "dict" else self.memory[0]
        h = torch.tanh(self.layer(x if previous is None else x + previous.mean(0)))
        kept = h.detach()
        if self.holder == "append":
            self.memory.append(kept)
        else:
            self.memory = {"h": kept} if self.holder == "dict" else ([kept] if self.holder == "list" else (kept, kept))
        return self.head(h)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("holder", ["list", "tuple", "dict", "append"])
def test_tensors_kept_in_a_container_on_the_module_fall_back(holder: str) -> None:
    eager, ort = fit_both(
        lambda: CarriedMemory(holder), mlp_loader, 5, strategy=ORTStrategy(fullgraph=True, fallback="warn")
    )
    (report,) = ort.reports
    assert report.fallback_reason is not None and "stores tensor(s) self.memory[" in report.fallback_reason
    # the export's forward runs appended twice more; put back, the memory holds what eager's does
    assert len(ort.model.memory) == len(eager.model.memory)
    assert_losses_match(eager, ort, rtol=0)
    assert_states_match(eager, ort, atol=0, rtol=0)


class MeasuredSpectrum(DropoutThenSpectrum):
    """Updates a torchmetrics metric in forward; ``torch.fft`` then makes the export fail."""

    def __init__(self) -> None:
        super().__init__()
        self.drop.p = 0.0
        self.mean_logit = torchmetrics.MeanMetric()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        self.mean_logit.update(out.detach().abs().mean())
        return out


def test_side_effects_of_a_failed_export_are_undone() -> None:
    """The export's forward runs updated the metric before PyTorch ran the step's forward again: the first
    batch counted three times."""
    eager, ort = fit_both(MeasuredSpectrum, mlp_loader, 4, strategy=ORTStrategy(fullgraph=True, fallback="warn"))
    assert ort.reports[0].fallback_reason is not None
    assert float(ort.model.mean_logit.compute()) == float(eager.model.mean_logit.compute())
    assert ort.model.mean_logit.update_count == eager.model.mean_logit.update_count == 4


class BroadcastRouting(L.LightningModule):
    """Capsule-style routing: a weight broadcast over the batch in a matmul, then logits from zeros(B, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 20)
        self.weight = nn.Parameter(0.1 * torch.randn(1, 5, 3, 6, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = x.size(0)
        predictions = (self.weight @ self.lin(x).view(batch, 5, 1, 4, 1)).squeeze(-1)
        agreement = (predictions * predictions.sum(1, keepdim=True)).sum(-1)
        couplings = (torch.zeros(batch, 5, 3) + agreement).softmax(2)
        return (couplings.unsqueeze(-1) * predictions).sum(1).norm(dim=-1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_broadcast_over_the_batch_in_a_matmul_trains_in_ort() -> None:
    """ORT's gradient builder failed on it (HandleBroadcasting) until stop 24's shape-inference fixes."""
    eager, ort = fit_both(BroadcastRouting, mlp_loader, 3, strategy=ORTStrategy(fallback="warn"))
    assert_ort_ran(ort, 3)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class CallLog(MLP):
    """Appends to a list on every forward: the export's forward runs appended twice more, and a second call
    found the list changed only after ORT had counted the first step."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(1)
        return super().forward(x)


def test_a_list_changed_in_forward_falls_back_counting_each_call_once() -> None:
    eager, ort = fit_both(CallLog, mlp_loader, 4, strategy=ORTStrategy(fullgraph=True, fallback="warn"))
    (report,) = ort.reports
    assert report.fallback_reason is not None and "changes Python attribute(s) self.calls" in report.fallback_reason
    assert len(ort.model.calls) == len(eager.model.calls) == 4
    assert_losses_match(eager, ort)


class BatchScaled(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import math

        return super().forward(x) / math.sqrt(x.size(0))


def test_a_python_number_from_a_varying_size_falls_back_naming_sizes() -> None:
    eager, ort = fit_both(
        BatchScaled, lambda: mlp_loader(n=40), 3, strategy=ORTStrategy(fullgraph=True, fallback="warn")
    )
    (report,) = ort.reports
    assert report.fallback_reason is not None and "a size such as x.shape[0] is a tensor too" in report.fallback_reason
    assert_losses_match(eager, ort)


class AssertsSizes(MLP):
    """nanoGPT's ``assert t <= block_size``: an assertion on sizes or values, one line or several."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.body(x)
        assert x.shape[0] <= 64, f"batch of {x.shape[0]} over 64"
        assert hidden.shape[-1] == self.head.in_features and torch.isfinite(hidden).all(), (
            "hidden features must be finite"
        )
        return self.head(hidden)


class BranchesOnSize(MLP):
    """The same condition as a branch: the export would freeze the branch taken."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.body(x)
        if x.shape[0] <= 12:
            hidden = hidden * 2
        return self.head(hidden)


def test_assert_statements_train_in_ort() -> None:
    eager, ort = fit_both(AssertsSizes, mlp_loader, 6)
    assert_ort_ran(ort, 6)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_a_branch_on_the_asserted_condition_is_a_size_guard() -> None:
    """Four batches of 13, then one of 8: the branch is checked on every call, and the graph is exported again
    when it flips, with eager's results."""
    eager, ort = fit_both(BranchesOnSize, lambda: mlp_loader(batch_size=13, n=60), 5)
    (report,) = ort.reports
    assert report.fallback_reason is None and report.torch_calls == 0 and report.ort_calls == 5
    assert report.size_exports == 1
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class RotaryWithoutGradients(MLP):
    """Hugging Face's rotary embedding (transformers >= 4.38): ``@torch.no_grad()`` around a computation
    from a buffer and positions only, so ORT's graph is the same with gradients on."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16), persistent=False)

    @torch.no_grad()
    def rotary(self, positions: torch.Tensor) -> torch.Tensor:
        angles = positions[:, None].float() * self.inv_freq[None, :]
        return torch.cat([angles, angles], -1).cos()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x * self.rotary(torch.arange(x.shape[0]))
        if hidden.size() != x.size():  # transformers <= 4.37's attention checks, an `if` that only raises
            raise ValueError(f"hidden of size {hidden.size()}, expected {x.size()}")
        return self.head(self.body(hidden))


def test_no_grad_region_without_gradients_and_raising_size_check_train_in_ort() -> None:
    eager, ort = fit_both(RotaryWithoutGradients, mlp_loader, 6)
    assert_ort_ran(ort, 6)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
