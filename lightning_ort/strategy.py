"""``ORTStrategy``: single-device training with the model's compute in ONNX Runtime."""

from __future__ import annotations

import logging
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from lightning_ort import _compat
from lightning_ort.guard import FallbackMode, ORTGuard, ORTModuleReport
from lightning_ort.memory import validate_memory_options
from lightning_ort.optim import fuse_optimizer
from lightning_ort.precision import ort_precision
from lightning_ort.selection import FORWARD, select_modules

log = logging.getLogger(__name__)

LogLevel = Literal["VERBOSE", "INFO", "WARNING", "ERROR", "FATAL"]
_LOG_LEVELS = ("VERBOSE", "INFO", "WARNING", "ERROR", "FATAL")
_FALLBACKS = ("warn", "raise")


class ORTStrategy(SingleDeviceStrategy):
    """Train on one device with the LightningModule's compute running in ONNX Runtime (ORTModule).

    By default the LightningModule's own ``forward`` becomes one ORT graph, so ``self(x)`` in the
    steps runs in ORT. If the steps never call ``self(...)``, the children that hold trainable
    parameters are wrapped instead after the first training step. The loss, ``self.log`` and
    metrics stay in PyTorch.

    Args:
        modules: names of submodules to run in ORT (e.g. ``["encoder", "decoder"]``) instead of the
            automatic choice. ``"forward"`` names the LightningModule's own forward.
        log_level: ORT's log level: ``"VERBOSE"``, ``"INFO"``, ``"WARNING"``, ``"ERROR"`` or ``"FATAL"``.
        fallback: what happens when ORT cannot export or run a module: ``"warn"`` trains it in
            PyTorch after one warning; ``"raise"`` stops with ORT's reason.
        intra_op_num_threads: threads of ORT's intra-op pool; ``None`` lets ORT decide.
        allow_spinning: let idle ORT threads spin. Off by default: spinning threads compete with torch's.
        custom_autograd: run custom ``torch.autograd.Function``s inside ORT graphs (their forward and
            custom backward are called back in Python). ``None``: on when lightning_ort's C++ runner
            can be built (g++, ninja) or is cached; ``False``: modules applying them train in PyTorch
            after one warning; ``True``: error if the runner cannot be built.
        fused_optimizer: replace a torch ``Adam``/``AdamW`` from ``configure_optimizers`` with a fused
            implementation (torch's fused kernels on CPU, ORT's ``FusedAdam`` on CUDA). Other
            optimizers are left as they are.
        memory_optimization_level: ORT's memory optimizer, as ORT 1.19.2 defines it: 0 applies only the
            recompute plans of ``memory_optimizer_config``; 1 recomputes transformer layers' activations
            in the backward pass; 2 also recomputes "compromised" subgraphs (more compute, less memory).
        memory_optimizer_config: JSON file with a list of recompute plans (e.g. ``["BiasGelu+:1:-1"]``),
            applied at level 0.
        device: the device to train on, e.g. ``"cpu"`` or ``"cuda:0"``; by default the Trainer's
            ``accelerator`` and ``devices`` choose it.
        accelerator: see :class:`~lightning.pytorch.strategies.SingleDeviceStrategy`.
        checkpoint_io: see :class:`~lightning.pytorch.strategies.SingleDeviceStrategy`.
        precision_plugin: see :class:`~lightning.pytorch.strategies.SingleDeviceStrategy`.
    """

    strategy_name = "ort"

    def __init__(
        self,
        modules: list[str] | None = None,
        log_level: LogLevel = "WARNING",
        fallback: FallbackMode = "warn",
        intra_op_num_threads: int | None = None,
        allow_spinning: bool = False,
        custom_autograd: bool | None = None,
        fused_optimizer: bool = False,
        memory_optimization_level: int = 0,
        memory_optimizer_config: str | None = None,
        device: str | None = None,
        accelerator: pl.accelerators.Accelerator | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
    ) -> None:
        super().__init__(
            device=device or "cpu",
            accelerator=accelerator,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        if log_level not in _LOG_LEVELS:
            raise ValueError(f"ORTStrategy(log_level={log_level!r}) is not one of {', '.join(_LOG_LEVELS)}.")
        if fallback not in _FALLBACKS:
            raise ValueError(f"ORTStrategy(fallback={fallback!r}) must be 'warn' or 'raise'.")
        if modules is not None and (
            isinstance(modules, str) or not all(isinstance(name, str) and name for name in modules)
        ):
            raise TypeError(f"ORTStrategy(modules={modules!r}) must be a list of submodule names, e.g. ['encoder'].")
        if intra_op_num_threads is not None and (not isinstance(intra_op_num_threads, int) or intra_op_num_threads < 1):
            raise ValueError(f"ORTStrategy(intra_op_num_threads={intra_op_num_threads!r}) must be a positive int.")
        self.modules = list(modules) if modules is not None else None
        self.log_level: LogLevel = log_level
        self.fallback: FallbackMode = fallback
        self.custom_autograd = custom_autograd
        self.fused_optimizer = fused_optimizer
        self.runtime_options = _compat.ORTRuntimeOptions(
            log_level=log_level,
            intra_op_num_threads=intra_op_num_threads,
            allow_spinning=allow_spinning,
            memory_optimization_level=memory_optimization_level,
            memory_optimizer_config=validate_memory_options(memory_optimization_level, memory_optimizer_config),
        )
        self._device_given = device is not None
        self._guards: list[ORTGuard] = []
        self._retired: list[ORTModuleReport] = []
        self._auto_forward = False

    @property
    def parallel_devices(self) -> list[torch.device] | None:
        """The device given to the constructor, if any (the Trainer fills it in otherwise)."""
        return [self._root_device] if self._device_given else None

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device] | None) -> None:
        if devices and not self._device_given:
            self._root_device = torch.device(devices[0])

    @property
    def ort_reports(self) -> list[ORTModuleReport]:
        """One report per module ORT was asked to run in the current or last run (calls, fallback reason)."""
        return self._retired + [guard.report for guard in self._guards]

    @property  # type: ignore[override]
    def precision_plugin(self) -> Precision:
        return self._precision_plugin if self._precision_plugin is not None else Precision()

    @precision_plugin.setter
    def precision_plugin(self, plugin: Precision | None) -> None:
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

    @property
    def ort_modules(self) -> dict[str, torch.nn.Module]:
        """The ORTModules of the current run by name (``"forward"`` or a submodule name), for callbacks."""
        return {guard.report.name: guard.ort_module for guard in self._guards if guard.ort_module is not None}

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        _compat.check_installation()
        _compat.check_device(self.root_device)
        _compat.ortmodule_package()
        super().setup(trainer)

    @override
    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        assert isinstance(model, pl.LightningModule)
        self._teardown_guards()
        self._retired = []
        selection = select_modules(model, self.modules)
        self._auto_forward = self.modules is None and selection == [FORWARD]
        self._install(model, selection)
        return model

    def _install(self, model: pl.LightningModule, names: list[str]) -> None:
        _compat.custom_function_support(self.custom_autograd)
        for name in names:
            owner = model if name == FORWARD else model.get_submodule(name)
            guard = ORTGuard(name, owner, self.runtime_options, self.fallback)
            guard.install()
            self._guards.append(guard)
        log.info("lightning_ort: ORT runs %s", ", ".join(names) or "nothing")

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        return self._after_step("training_step", super().training_step(*args, **kwargs))

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        return self._after_step("validation_step", super().validation_step(*args, **kwargs))

    @override
    def test_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        return self._after_step("test_step", super().test_step(*args, **kwargs))

    @override
    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
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
        for guard in self._guards:
            guard.uninstall()
        self._retired += [guard.report for guard in self._guards]
        self._guards = []

    @override
    def teardown(self) -> None:
        self._teardown_guards()
        super().teardown()

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        if cls.strategy_name in strategy_registry:
            return
        strategy_registry.register(cls.strategy_name, cls, description="Single-device training through ONNX Runtime")
