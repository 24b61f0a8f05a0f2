"""``ORTDDPStrategy``: Lightning's DistributedDataParallel with each process's compute in ONNX Runtime."""

from __future__ import annotations

import gc
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

from lightning_ort.auto_choice import Mode
from lightning_ort.guard import FallbackMode
from lightning_ort.strategy_options import LogLevel
from lightning_ort.wrapping import ORTStrategyMixin

StartMethod = Literal["popen", "spawn", "fork", "forkserver"]


class ORTDDPStrategy(ORTStrategyMixin, DDPStrategy):
    """Data-parallel training (``torch.distributed``; gloo on CPU) with every process's compute in ONNX Runtime.

    Each process wraps the LightningModule's ``forward`` (or the modules named in ``modules``) in ORT
    exactly as :class:`~lightning_ort.ORTStrategy` does, *then* Lightning wraps the LightningModule
    in ``DistributedDataParallel``. ORT returns the gradients of the parameters it trains to
    PyTorch's autograd, where DDP's hooks average them across processes before the optimizer step,
    so every process applies the same update. Launching, ranks, samplers and multi-node runs are
    Lightning's :class:`~lightning.pytorch.strategies.DDPStrategy` unchanged.

    Registered as ``"ort_ddp"`` (Lightning re-runs the script per process), ``"ort_ddp_spawn"``,
    ``"ort_ddp_fork"`` and ``"ort_ddp_notebook"``.

    Args:
        modules: see :class:`~lightning_ort.ORTStrategy`.
        log_level: see :class:`~lightning_ort.ORTStrategy`.
        fallback: see :class:`~lightning_ort.ORTStrategy`. With ``"warn"`` a module ORT gives up on
            trains in PyTorch in that process; gradients are averaged all the same.
        intra_op_num_threads: threads of each process's ORT intra-op pool; ``None`` lets ORT decide.
            With several processes on one machine, cores / processes is a good value.
        allow_spinning: see :class:`~lightning_ort.ORTStrategy`.
        custom_autograd: see :class:`~lightning_ort.ORTStrategy`.
        fused_optimizer: see :class:`~lightning_ort.ORTStrategy`.
        memory_optimization_level: see :class:`~lightning_ort.ORTStrategy`.
        memory_optimizer_config: see :class:`~lightning_ort.ORTStrategy`.
        op_rewrites: see :class:`~lightning_ort.ORTStrategy`.
        channels_last: see :class:`~lightning_ort.ORTStrategy`.
        fuse_attention: see :class:`~lightning_ort.ORTStrategy`.
        memory_arena: see :class:`~lightning_ort.ORTStrategy`.
        export_cache: see :class:`~lightning_ort.ORTStrategy`.
        fullgraph: see :class:`~lightning_ort.ORTStrategy`.
        export_timeout: see :class:`~lightning_ort.ORTStrategy`.
        mode: see :class:`~lightning_ort.ORTStrategy`; each process measures and chooses on its own (both
            paths train the same parameters, so processes that choose differently still train correctly).
        start_method: how Lightning starts the processes: ``"popen"`` (re-run the script),
            ``"spawn"``, ``"fork"`` or ``"forkserver"``.
        **kwargs: forwarded to ``torch.nn.parallel.DistributedDataParallel`` (e.g.
            ``find_unused_parameters=True``), as with :class:`~lightning.pytorch.strategies.DDPStrategy`.

    The remaining arguments are :class:`~lightning.pytorch.strategies.DDPStrategy`'s.
    """

    strategy_name = "ort_ddp"

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
        op_rewrites: bool | None = None,
        channels_last: bool = True,
        fuse_attention: bool = False,
        memory_arena: bool = True,
        export_cache: bool = False,
        fullgraph: bool = False,
        export_timeout: float | None = 300.0,
        mode: Mode = "auto",
        accelerator: pl.accelerators.Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
        ddp_comm_state: object | None = None,
        ddp_comm_hook: Callable | None = None,
        ddp_comm_wrapper: Callable | None = None,
        model_averaging_period: int | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        start_method: StartMethod = "popen",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            ddp_comm_state=ddp_comm_state,
            ddp_comm_hook=ddp_comm_hook,
            ddp_comm_wrapper=ddp_comm_wrapper,
            model_averaging_period=model_averaging_period,
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
            **kwargs,
        )
        self._init_ort(
            modules=modules,
            log_level=log_level,
            fallback=fallback,
            intra_op_num_threads=intra_op_num_threads,
            allow_spinning=allow_spinning,
            custom_autograd=custom_autograd,
            fused_optimizer=fused_optimizer,
            memory_optimization_level=memory_optimization_level,
            memory_optimizer_config=memory_optimizer_config,
            op_rewrites=op_rewrites,
            channels_last=channels_last,
            fuse_attention=fuse_attention,
            memory_arena=memory_arena,
            export_cache=export_cache,
            fullgraph=fullgraph,
            export_timeout=export_timeout,
            mode=mode,
        )

    @override
    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if self._start_method != "popen":
            self._launcher = _ORTMultiProcessingLauncher(self, start_method=self._start_method)

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        # Fitting: DDPStrategy.setup calls _setup_model, which installs the guards, then wraps in DDP.
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            # Validate, test and predict run without the DDP wrapper (no gradients to average).
            model = self.lightning_module
            assert model is not None
            self._wrap_in_ort(model)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        entries = (
            ("ort_ddp", "popen"),
            ("ort_ddp_spawn", "spawn"),
            ("ort_ddp_fork", "fork"),
            ("ort_ddp_notebook", "fork"),
        )
        for name, start_method in entries:
            if name in strategy_registry:
                continue
            strategy_registry.register(
                name,
                cls,
                description=f"DDP through ONNX Runtime with `start_method` '{start_method}'",
                start_method=start_method,
            )


class _ORTMultiProcessingLauncher(_MultiProcessingLauncher):
    """Lightning's spawn/fork launcher, made safe to fork a process that has run ORT before.

    An ORT session of an earlier run that is already garbage but not yet collected (ORT's objects
    form reference cycles) is copied into each forked child; when the child's garbage collector frees
    it, ORT joins the parent's thread-pool threads, which do not exist in the child, and the child
    hangs. Collecting before the fork frees such sessions in the parent.
    """

    @override
    def launch(self, function: Callable, *args: Any, trainer: pl.Trainer | None = None, **kwargs: Any) -> Any:
        if self._start_method == "fork":
            gc.collect()
        return super().launch(function, *args, trainer=trainer, **kwargs)
