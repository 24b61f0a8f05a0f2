"""Build ORTModule instances from lightning_ort's typed options."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import onnx
import torch

from lightning_ort.engine.bootstrap.loader import ortmodule_package
from lightning_ort.engine.runtime import backward_once, memory_arena
from lightning_ort.engine.runtime.settings import ModuleSettings, attach


@dataclass(frozen=True)
class ORTRuntimeOptions:
    """Settings applied to every ORTModule that lightning_ort creates.

    Args:
        log_level: ORT's log level name (``VERBOSE``, ``INFO``, ``WARNING``, ``ERROR``, ``FATAL``).
        intra_op_num_threads: threads of ORT's intra-op pool; ``None`` lets ORT choose.
        allow_spinning: whether idle ORT threads spin (fast hand-off, but they compete with torch's threads).
        session_config: extra ``SessionOptions.add_session_config_entry`` items.
        memory_optimization_level: ORT's ``_MemoryOptimizationLevel`` (0, 1 or 2).
        memory_optimizer_config: path of a JSON list of recompute plans (used at level 0).
        export_cache: reuse the ONNX export of an identical module from an earlier process (see
            ``export_cache.py``).
        profile_file_prefix: turn on ORT's per-node profiler; its JSON goes to files starting with
            this prefix (see :func:`end_profiling`).
        op_rewrites: export the ops ORT's CPU kernels run slowly in faster forms (see
            ``op_rewrites.py``); ``None``: on for modules on the CPU, unless a memory optimization is
            set (ORT's recompute plans need ORT's own ops).
        channels_last: with ``op_rewrites``, hold the activations of 2-D convolutions, BatchNorm,
            pooling and upsampling in channels-last memory inside ORT's graph (see ``channels_last.py``).
        fuse_attention: with ``op_rewrites``, run attention written out by hand as torch's fused
            attention kernels (see ``attention_fusion.py``).
        memory_arena: torch kernels inside ORT's graph keep their CPU memory for the next step
            instead of giving it back to the system (see ``memory_arena.py``).
    """

    log_level: str = "WARNING"
    intra_op_num_threads: int | None = None
    allow_spinning: bool = False
    session_config: dict[str, str] = field(default_factory=dict)
    memory_optimization_level: int = 0
    memory_optimizer_config: str | None = None
    op_rewrites: bool | None = None
    channels_last: bool = True
    fuse_attention: bool = False
    memory_arena: bool = True
    profile_file_prefix: str | None = None
    export_cache: bool = False

    @property
    def memory_optimized(self) -> bool:
        """Whether ORT's memory optimizer has recompute work (a level, or plans from a config)."""
        return self.memory_optimization_level > 0 or bool(self.memory_optimizer_config)

    def session_entries(self) -> dict[str, str]:
        """``SessionOptions`` config entries: thread spinning, then :attr:`session_config`."""
        entries = {"session.intra_op.allow_spinning": "1" if self.allow_spinning else "0"}
        entries.update(self.session_config)
        return entries

    def module_settings(self, module: torch.nn.Module, arena: bool) -> ModuleSettings:
        """These options resolved for ``module`` (``op_rewrites=None`` decided by its device), with the memory
        arena on only if ``arena`` (it serves allocations in this process)."""
        rewrites = self.op_rewrites
        if rewrites is None:
            rewrites = not self.memory_optimized and all(tensor.device.type == "cpu" for tensor in module.parameters())
        return ModuleSettings(
            op_rewrites=rewrites,
            export_cache=self.export_cache,
            channels_last=rewrites and self.channels_last,
            unbind=rewrites,
            fuse_attention=rewrites and self.fuse_attention,
            memory_arena=self.memory_arena and arena,
            session_entries=MappingProxyType(self.session_entries()),
            intra_op_num_threads=self.intra_op_num_threads,
            profile_file_prefix=self.profile_file_prefix,
        )


@contextlib.contextmanager
def _fallback_disabled(package: Any) -> Iterator[None]:
    """ORT's own fallback would silently run PyTorch; lightning_ort decides about fallback itself."""
    from onnxruntime.training.ortmodule._fallback import _FallbackPolicy

    saved = package.ORTMODULE_FALLBACK_POLICY
    package.ORTMODULE_FALLBACK_POLICY = _FallbackPolicy.FALLBACK_DISABLE
    try:
        yield
    finally:
        package.ORTMODULE_FALLBACK_POLICY = saved


def _execution_managers(ort_module: torch.nn.Module) -> tuple[Any, Any]:
    factory = ort_module._torch_module._execution_manager
    return factory(True), factory(False)


def wrap_module(module: torch.nn.Module, options: ORTRuntimeOptions) -> torch.nn.Module:
    """Return an ORTModule around ``module`` configured by ``options``.

    Raises whatever ORT raises at construction; export errors surface on the first forward.
    """
    package = ortmodule_package()
    debug_options = package.DebugOptions(log_level=package.LogLevel[options.log_level])
    modes = {submodule: submodule.training for submodule in module.modules()}
    with _fallback_disabled(package):
        ort_module = package.ORTModule(module, debug_options)
    for submodule, mode in modes.items():  # ORTModule.__init__ calls train() recursively
        submodule.training = mode
    if getattr(ort_module, "_torch_module", None) is None or not hasattr(
        ort_module._torch_module, "_execution_manager"
    ):
        # ORT switched to its PyTorch backend during construction; surface why.
        raise RuntimeError(f"ORTModule could not be created: {ort_module._fallback_manager._exception}")
    from onnxruntime.training.ortmodule.options import _SkipCheck

    settings = options.module_settings(module, arena=options.memory_arena and memory_arena.install())
    attach(settings, ort_module._torch_module._flattened_module, *_execution_managers(ort_module))
    training_manager = _execution_managers(ort_module)[0]
    _apply_memory_options(training_manager._runtime_options, options)
    for manager in _execution_managers(ort_module):
        # ORT's default "fast path" never looks at the inputs or at requires_grad again after the
        # first step, so a new input key or a layer unfrozen mid-training would go unnoticed.
        manager._runtime_options.skip_check = _SkipCheck.SKIP_CHECK_DISABLED
    return ort_module


def _apply_memory_options(runtime_options: Any, options: ORTRuntimeOptions) -> None:
    """What ORT's ORTMODULE_MEMORY_OPT_LEVEL / ORTMODULE_MEMORY_OPT_CONFIG would set, for one module."""
    runtime_options.memory_optimization_level = options.memory_optimization_level
    runtime_options.memory_optimizer_config_file_path = options.memory_optimizer_config or ""
    if options.memory_optimization_level in (1, 2):
        # probe recompute subgraphs within transformer layer boundaries, as ORT does for these levels
        runtime_options.recompute_probe_config = "1:1"


def memory_optimization_level(ort_module: torch.nn.Module) -> int:
    """The memory optimization level ORT's training graph of ``ort_module`` uses."""
    return int(_execution_managers(ort_module)[0]._runtime_options.memory_optimization_level)


def recompute_plans(ort_module: torch.nn.Module) -> list[str]:
    """The recompute plans ORT's memory optimizer applies to the training graph (after the first step)."""
    path = _execution_managers(ort_module)[0]._runtime_options.memory_optimizer_config_file_path
    if not path:
        return []
    with open(path) as file:
        return [plan for plan in json.load(file) if plan]


def exported_model(ort_module: torch.nn.Module, training: bool) -> onnx.ModelProto | None:
    """The ONNX model ORT exported for ``ort_module`` in training or inference mode, if any."""
    info = _model_info(ort_module, training, "_exported_model_info")
    return None if info is None else info.exported_model


def processed_model(ort_module: torch.nn.Module, training: bool) -> onnx.ModelProto | None:
    """The graph ORT differentiates (training) or runs (inference) for ``ort_module``: the export after
    ORT's and lightning_ort's rewrites (channels-last layout, gradient overloads), if built yet."""
    info = _model_info(ort_module, training, "_post_export_processed_model_info")
    return None if info is None else info._post_export_processed_model


def _model_info(ort_module: torch.nn.Module, training: bool, name: str) -> Any:
    """ORT's graph transition manager's ``name`` record for the training or inference graph, if any."""
    transitions = _execution_managers(ort_module)[0 if training else 1]._graph_transition_manager
    return getattr(transitions, name, None) if transitions is not None else None


def set_training_flag(ort_module: torch.nn.Module, graph: bool, module_training: bool) -> None:
    """Select ORT's training (``graph=True``) or inference graph, and the wrapped module's own mode.

    ``ORTModule.train()`` would recurse into every submodule and undo modes the user set on purpose
    (a frozen BatchNorm in eval mode, for instance). The wrapped module's own flag is what its
    ``forward`` sees as ``self.training`` (and what the export preserves), so a module in eval mode
    can still run the training graph when autograd records.
    """
    flattened = ort_module._torch_module._flattened_module
    ort_module.training = flattened.training = graph
    flattened._original_module.training = module_training


def backward_pending(ort_module: torch.nn.Module) -> bool:
    """Whether a forward call of ORT's training graph still awaits its backward pass."""
    return backward_once.backward_pending(_execution_managers(ort_module)[0])


def export_again(ort_module: torch.nn.Module, graph: bool) -> None:
    """Make ORT export its training (or inference) graph again on the next call."""
    transitions = _execution_managers(ort_module)[0 if graph else 1]._graph_transition_manager
    if transitions is not None:
        transitions.signal_model_changed()


def read_module_tensors_again(ort_module: torch.nn.Module) -> None:
    """Make both of ORT's graphs take the module's parameters and buffers anew on their next run: ORT keeps
    the tensor objects of its first run, so a buffer replaced since (``self.center = ...``) was never read."""
    for manager in _execution_managers(ort_module):
        transitions = manager._graph_transition_manager
        info = getattr(transitions, "_post_export_processed_model_info", None) if transitions is not None else None
        if info is not None:
            info._buffer_for_ort_runs = None


def end_profiling(ort_module: torch.nn.Module) -> str | None:
    """Stop ORT's profiler of the training session; the path of its JSON (None without a session)."""
    agent = getattr(_execution_managers(ort_module)[0], "_execution_agent", None)
    return None if agent is None else agent._inference_session.end_profiling()
