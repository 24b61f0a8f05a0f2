"""``ORTStrategy``: single-device training with the model's compute in ONNX Runtime."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import SingleDeviceStrategy
from typing_extensions import override

from lightning_ort.auto_choice import Mode
from lightning_ort.guard import FallbackMode
from lightning_ort.strategy_options import LogLevel
from lightning_ort.wrapping import ORTStrategyMixin

__all__ = ["LogLevel", "ORTStrategy"]


class ORTStrategy(ORTStrategyMixin, SingleDeviceStrategy):
    """Train on one device with the LightningModule's compute running in ONNX Runtime (ORTModule).

    By default the LightningModule's own ``forward`` becomes one ORT graph, so ``self(x)`` in the
    steps runs in ORT. If the steps never call ``self(...)``, the children that hold trainable
    parameters are wrapped instead after the first training step (an ``nn.ModuleList``'s or
    ``nn.ModuleDict``'s items, as the container itself is never called). The loss, ``self.log`` and
    metrics stay in PyTorch.

    Args:
        modules: names of submodules to run in ORT (e.g. ``["encoder", "decoder"]``) instead of the
            automatic choice. ``"forward"`` names the LightningModule's own forward; a
            ``nn.ModuleList`` or ``nn.ModuleDict`` stands for its items.
        log_level: ORT's log level: ``"VERBOSE"``, ``"INFO"``, ``"WARNING"``, ``"ERROR"`` or ``"FATAL"``, in
            upper or lower case; Python's ``"DEBUG"`` and ``"CRITICAL"`` mean ORT's lowest and highest,
            ``"VERBOSE"`` and ``"FATAL"``. ``strategy.log_level`` holds ORT's name.
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
        op_rewrites: export the ops ORT's CPU kernels run slowly in faster forms: convolutions, linear
            layers, GELU, ReLU, LayerNorm, attention without dropout and the matmul, masked_fill and
            softmax of hand-written attention run torch's kernels inside the ORT graph, and
            constant-index ``select`` becomes ``Slice`` (see the docs' performance page). ``None``
            (default): on for models on the CPU, off on CUDA and when a memory optimization is set
            (ORT cannot recompute torch's kernels). Same results as eager (convolution networks: see
            ``channels_last``).
        channels_last: with ``op_rewrites``, hold the activations between 2-D convolutions, BatchNorm,
            GroupNorm, pooling and upsampling layers in channels-last memory inside the ORT graph, where torch's
            CPU kernels for them run faster (the benchmark's CNN: 1.2x, its U-Net: 1.2-1.5x). Results
            are those of eager PyTorch on a model and inputs in ``torch.channels_last`` memory;
            against standard memory they differ by float rounding (the kernels sum in another
            order). ``False``: standard memory, eager's exact results.
        fuse_attention: with ``op_rewrites``, run attention written out by hand (``q @ k.transpose(-2,
            -1)``, an optional constant scale, an optional ``masked_fill`` with ``-inf``, ``softmax``
            over the last dimension, ``@ v``) as one call of torch's fused attention kernels, as
            ``F.scaled_dot_product_attention`` would (the benchmark's GPT: about 6% faster per
            step). Off by default: results then differ from eager by float rounding instead of
            being eager's exact ones, which an adaptive optimizer can amplify on parameters whose
            gradient is zero in exact arithmetic (the key projection's bias), and a query whose
            keys are all masked gets zeros where eager gets NaN.
        memory_arena: on the CPU, the training, validation, test and predict steps (the torch
            kernels inside the ORT graph, and the loss, backward and optimizer step around it) keep
            the memory they allocate for the next step, as ORT's own kernels do in ORT's arena,
            instead of handing it back to the system and page-faulting it in again (the
            benchmark's models through ORT: 1.04-1.44x faster than without it). It keeps at most
            twice the peak memory of those allocations; results are unchanged. ``False``: allocate
            through torch's CPU allocator.
        export_cache: reuse the ONNX export of an identical model from an earlier run (saves 0.3-0.5 s
            of the first step), in ``$LIGHTNING_ORT_CACHE/exports``. The cache key covers the model's
            code, attributes, parameters and inputs; a ``forward`` that reads other state (environment
            variables, globals set at run time) must not use it. Off by default.
        fullgraph: ``False`` (default): when ORT cannot run a module as a whole, its submodules that hold
            trainable parameters become ORT graphs of their own (each may break down further), and the code
            between them runs in PyTorch: a graph break at module granularity, as torch.compile breaks graphs.
            ``True``: each selected module runs in ORT as a whole or in PyTorch as a whole.
            ``ort_reports`` and ``ort_parameter_share`` say what ORT runs.
        export_timeout: seconds a module's ORT call may take when it exports and builds a graph (its first
            call in training and in eval, and each new export); past it the module falls back (or breaks
            down, see ``fullgraph``) with a reason that says so. ``None``: no limit. Only the main thread
            can be interrupted; elsewhere there is no limit.
        mode: ``"auto"`` (default): each wrapped module's first training steps run in ORT and in PyTorch by
            turns (11-19 steps, the first ORT step with its export), and the faster path by the median step
            trains it for the rest of the run (ORT unless PyTorch measured more than 2% faster); the choice and
            the measured speed are logged and reported (``ort_reports``: ``auto_choice``, ``measured_speedup``).
            Both paths train correctly at every step. A run expected to be shorter than the measurement
            (``max_steps``, ``max_epochs``) trains in ORT throughout. ``"ort"``: ORT runs the wrapped modules
            at every step, however fast.
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
        op_rewrites: bool | None = None,
        channels_last: bool = True,
        fuse_attention: bool = False,
        memory_arena: bool = True,
        export_cache: bool = False,
        fullgraph: bool = False,
        export_timeout: float | None = 300.0,
        mode: Mode = "auto",
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
        self._device_given = device is not None

    @property
    def parallel_devices(self) -> list[torch.device] | None:
        """The device given to the constructor, if any (the Trainer fills it in otherwise)."""
        return [self._root_device] if self._device_given else None

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device] | None) -> None:
        if devices and len(devices) > 1:
            raise ValueError(
                f"ORTStrategy trains on one device; the Trainer asks for {len(devices)} "
                f"({', '.join(map(str, devices))}). Fix: Trainer(strategy='ort_ddp', devices={len(devices)}) "
                "trains on all of them through ORT, or pass devices=1."
            )
        if devices and not self._device_given:
            self._root_device = torch.device(devices[0])

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        if cls.strategy_name in strategy_registry:
            return
        strategy_registry.register(cls.strategy_name, cls, description="Single-device training through ONNX Runtime")
