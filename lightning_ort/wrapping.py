"""What every ORT strategy shares: its options, the ORT guards around the model, and their reports.

:class:`ORTStrategyMixin` goes first in a Lightning strategy's bases (``class ORTDDPStrategy(
ORTStrategyMixin, DDPStrategy)``). It installs the guards in ``_setup_model`` *before* calling the
strategy's own ``_setup_model``, so a wrapper such as DDP wraps a LightningModule whose ``forward``
(or whose children's) already runs in ORT, and removes them in ``teardown`` before the strategy
unwraps the model.

Over 300 lines because :class:`ORTStrategyMixin` is one class: the Lightning strategy hooks ORT needs
(setup, the steps, optimizer state, teardown) and the reports they keep; its option checks are in
``strategy_options.py``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.types import STEP_OUTPUT
from torch.optim import Optimizer
from typing_extensions import override

from lightning_ort import engine
from lightning_ort.auto_choice import Mode, SpeedChoice
from lightning_ort.guard import FallbackMode, ORTGuard
from lightning_ort.memory_options import validate_memory_options
from lightning_ort.optim import fuse_again, fuse_optimizer, unfused_state
from lightning_ort.precision import ort_precision
from lightning_ort.report import ORTModuleReport
from lightning_ort.selection import FORWARD, select_modules, trainable_children
from lightning_ort.strategy_options import LogLevel, check_options
from lightning_ort.summary import RunSummary, fit_summary

log = logging.getLogger(__name__)


class ORTStrategyMixin(Strategy):
    """Runs the LightningModule's compute in ONNX Runtime under any Lightning strategy it is mixed into.

    Subclasses call :meth:`_init_ort` from ``__init__``. ``isinstance(strategy, ORTStrategyMixin)``
    tells whether a Trainer trains through ORT (single-device or DDP).
    """

    modules: list[str] | None
    log_level: engine.LogLevelName
    fallback: FallbackMode
    custom_autograd: bool | None
    fused_optimizer: bool
    runtime_options: engine.ORTRuntimeOptions
    fullgraph: bool
    export_timeout: float | None
    mode: Mode
    _guards: list[ORTGuard]
    _retired: list[ORTModuleReport]
    _auto_forward: bool
    _warned: set[str]
    _retired_share: float | None
    _batch_starts: list[float]

    def _init_ort(
        self,
        modules: list[str] | None,
        log_level: LogLevel,
        fallback: FallbackMode,
        intra_op_num_threads: int | None,
        allow_spinning: bool,
        custom_autograd: bool | None,
        fused_optimizer: bool = False,
        memory_optimization_level: int = 0,
        memory_optimizer_config: str | None = None,
        op_rewrites: bool | None = None,
        channels_last: bool = True,
        fuse_attention: bool = False,
        memory_arena: bool = True,
        export_cache: bool = False,
        fullgraph: bool = False,
        export_timeout: float | None = 300.0,
        mode: Mode = "auto",
    ) -> None:
        """Check and store the ORT options (every error names the strategy class and the bad value)."""
        name = type(self).__name__
        level = check_options(
            name,
            mode=mode,
            log_level=log_level,
            fallback=fallback,
            modules=modules,
            intra_op_num_threads=intra_op_num_threads,
            flags=dict(
                allow_spinning=allow_spinning,
                fused_optimizer=fused_optimizer,
                channels_last=channels_last,
                fuse_attention=fuse_attention,
                memory_arena=memory_arena,
                export_cache=export_cache,
                fullgraph=fullgraph,
            ),
            optional_flags=dict(custom_autograd=custom_autograd, op_rewrites=op_rewrites),
            export_timeout=export_timeout,
        )
        self.mode = mode
        memory_optimizer_config = validate_memory_options(memory_optimization_level, memory_optimizer_config)
        self.modules = list(modules) if modules is not None else None
        self.log_level = level
        self.fallback = fallback
        self.custom_autograd = custom_autograd
        self.fused_optimizer = fused_optimizer
        self.fullgraph = fullgraph
        self.export_timeout = None if export_timeout is None else float(export_timeout)
        self.runtime_options = engine.ORTRuntimeOptions(
            log_level=level,
            intra_op_num_threads=intra_op_num_threads,
            allow_spinning=allow_spinning,
            memory_optimization_level=memory_optimization_level,
            memory_optimizer_config=memory_optimizer_config,
            op_rewrites=op_rewrites,
            channels_last=channels_last,
            fuse_attention=fuse_attention,
            memory_arena=memory_arena,
            export_cache=export_cache,
        )
        if op_rewrites and self.runtime_options.memory_optimized:
            rank_zero_warn(
                f"{name}(op_rewrites=True) runs linear layers, convolutions, GELU, ReLU, LayerNorm and"
                " attention on torch's kernels, which ORT's memory optimizer cannot recompute, so its"
                " recompute plans cover less. Leave op_rewrites=None (off when a memory optimization is"
                " set) to let ORT recompute them."
            )
        self._guards = []
        self._retired = []
        self._auto_forward = False
        self._warned = set()
        self._retired_share = None

    @property
    def ort_reports(self) -> list[ORTModuleReport]:
        """One report per module ORT was asked to run in the current or last run (calls, fallback reason).

        A module ORT gave up on as a whole names the submodules that ORT runs instead
        (:attr:`ORTModuleReport.submodules`); they follow it in the list, with reports of their own.
        """
        return self._retired + [guard.report for guard in self._guards]

    @property
    def ort_parameter_share(self) -> float | None:
        """The share of the LightningModule's trainable parameters (elements) whose module ORT trains, in the
        current or last run, from 0.0 to 1.0: modules ORT ran in training without giving up on them as a
        whole (nor ``mode="auto"`` choosing PyTorch). ``None`` before a model with trainable parameters is set
        up."""
        return self._parameter_share() if self._guards else self._retired_share

    def _parameter_share(self) -> float | None:
        model = self.lightning_module
        total = {} if model is None else {id(p): p.numel() for p in model.parameters() if p.requires_grad}
        if not total:
            return None
        in_ort: dict[int, int] = {}
        for guard in self._guards:
            report = guard.report
            trained_in_ort = report.fallback_reason is None and report.auto_choice != "pytorch"
            if trained_in_ort and not report.submodules and report.ort_calls:
                in_ort.update((id(p), p.numel()) for p in guard.owner.parameters() if id(p) in total)
        return sum(in_ort.values()) / sum(total.values())

    @property
    def ort_modules(self) -> dict[str, torch.nn.Module]:
        """The ORTModules of the current run by name (``"forward"`` or a submodule name), for callbacks."""
        return {guard.report.name: guard.ort_module for guard in self._guards if guard.ort_module is not None}

    @property  # type: ignore[override]
    def precision_plugin(self) -> Precision:
        return self._precision_plugin if self._precision_plugin is not None else Precision()

    @precision_plugin.setter
    def precision_plugin(self, plugin: Precision | None) -> None:
        # Lightning's MixedPrecision becomes ORTPrecision; precisions ORT cannot train are refused here.
        self._precision_plugin = None if plugin is None else ort_precision(plugin)

    @override
    def setup_optimizers(self, trainer: pl.Trainer) -> None:
        super().setup_optimizers(trainer)
        if not self.fused_optimizer:
            return
        fused = [fuse_optimizer(optimizer) for optimizer in self.optimizers]
        for config in self.lr_scheduler_configs:
            for old, new in zip(self.optimizers, fused, strict=True):
                if config.scheduler.optimizer is old:  # type: ignore[union-attr]
                    config.scheduler.optimizer = new  # type: ignore[union-attr]
        self.optimizers = fused

    @override
    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        state = super().optimizer_state(optimizer)
        return unfused_state(getattr(optimizer, "_optimizer", optimizer), state)

    @override
    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        super().load_optimizer_state_dict(checkpoint)
        for optimizer in self.optimizers:
            fuse_again(optimizer)

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        engine.check_installation()
        engine.check_device(self.root_device)
        engine.ortmodule_package()
        super().setup(trainer)

    @override
    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        assert isinstance(model, pl.LightningModule)
        self._wrap_in_ort(model)
        return super()._setup_model(model)

    def _wrap_in_ort(self, model: pl.LightningModule) -> None:
        """Install fresh guards on ``model`` (its forward, or the modules named in ``modules``)."""
        self._teardown_guards()
        self._retired = []
        self._retired_share = None
        self._warned = set()
        selection = select_modules(model, self.modules)
        self._auto_forward = self.modules is None and selection == [FORWARD]
        self._install(model, selection)

    def _install(self, model: pl.LightningModule, names: list[str]) -> None:
        engine.custom_function_support(self.custom_autograd)
        break_down = None if self.fullgraph else self._break_down
        for name in names:
            owner = model if name == FORWARD else model.get_submodule(name)
            choice = SpeedChoice(name, self._expected_training_calls) if self.mode == "auto" else None
            guard = ORTGuard(
                name,
                owner,
                self.runtime_options,
                self.fallback,
                break_down,
                self._warned,
                self.export_timeout,
                choice,
            )
            guard.install()
            self._guards.append(guard)
        log.info("lightning_ort: ORT runs %s", ", ".join(names) or "nothing")

    def _break_down(self, guard: ORTGuard) -> list[str]:
        """A graph break at module granularity: when ORT gives up on a module's training graph, its children
        that hold trainable parameters (a container's items) become ORT graphs of their own, each of which
        may break down in turn; the module's own code between them runs in PyTorch. Returns their names."""
        model = self.lightning_module
        if model is None:
            return []
        prefix = "" if guard.report.name == FORWARD else guard.report.name + "."
        guarded = {id(other.owner) for other in self._guards}
        children = [
            name for name in trainable_children(guard.owner, prefix) if id(model.get_submodule(name)) not in guarded
        ]
        if children:
            self._install(model, children)
        return children

    def _expected_training_calls(self) -> int | None:
        """Training batches the run is expected to take from now (``None``: unbounded or unknown), for
        ``mode="auto"``; a resumed run counts from its checkpoint's step."""
        model = self.lightning_module
        try:
            trainer = model.trainer if model is not None else None
            steps = trainer.estimated_stepping_batches if trainer is not None else None
        except Exception:  # no Trainer attached, or Lightning cannot tell yet: the run is taken as long
            return None
        if trainer is None or steps is None or steps == float("inf"):
            return None
        return max(0, int(steps) - trainer.global_step) * max(1, trainer.accumulate_grad_batches)

    def _memory_arena(self) -> contextlib.AbstractContextManager[None]:
        """On the CPU, the arena serves the whole step (loss, backward, optimizer, user code), not only
        ORT's graph runs: eager code around the graph page-faults the same way."""
        return engine.memory_arena_scope(self.runtime_options.memory_arena and self.root_device.type == "cpu")

    @override
    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any],
        model: pl.LightningModule | torch.nn.Module | None = None,
        **kwargs: Any,
    ) -> Any:
        with self._memory_arena():  # automatic optimization runs training_step and backward in closure
            return super().optimizer_step(optimizer, closure, model, **kwargs)

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        with self._memory_arena():
            return self._after_step("training_step", super().training_step(*args, **kwargs))

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        with self._memory_arena():
            return self._after_step("validation_step", super().validation_step(*args, **kwargs))

    @override
    def test_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        with self._memory_arena():
            return self._after_step("test_step", super().test_step(*args, **kwargs))

    @override
    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        with self._memory_arena():
            return self._after_step("predict_step", super().predict_step(*args, **kwargs))

    def _after_step(self, step: str, output: Any) -> Any:
        """After the first step of a run: if it never called ``self(...)``, wrap the trainable children."""
        if self._auto_forward:
            self._auto_forward = False
            if not (self._guards[0].report.ort_calls or self._guards[0].report.torch_calls):
                model = self.lightning_module
                assert model is not None
                children = select_modules(model, None, prefer_forward=False)
                log.info("lightning_ort: %s does not call self(...); ORT runs %s instead", step, ", ".join(children))
                self._teardown_guards()
                self._install(model, children)
        return output

    def _teardown_guards(self) -> None:
        if self._guards:
            self._retired_share = self._parameter_share()
        for guard in self._guards:
            guard.uninstall()
        self._retired += [guard.report for guard in self._guards]
        self._guards = []

    @override
    def teardown(self) -> None:
        self._teardown_guards()
        engine.release_memory_arena()
        # ORT's export rules would make a later LightningModule.to_onnx write nodes only ORT's training build runs
        engine.remove_training_symbolics()
        super().teardown()

    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        self._batch_starts = []

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)
        self._batch_starts.append(time.perf_counter())

    @override
    def on_train_end(self) -> None:
        """Log the run summary (what ran in ORT, the first step's cost, steps/s) through Lightning's logger,
        on rank zero, unless a :class:`~lightning_ort.cli.RunSummary` callback prints its own."""
        super().on_train_end()
        end = time.perf_counter()
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if trainer is not None and any(isinstance(callback, RunSummary) for callback in trainer.callbacks):
            return
        summary = fit_summary(
            type(self).__name__, self.ort_reports, self._batch_starts, end, share=self.ort_parameter_share
        )
        rank_zero_info(summary)
