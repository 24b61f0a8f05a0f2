"""Runs one module's forward through ORT, or through PyTorch once ORT has given up on it.

Over 300 lines because :class:`ORTGuard` is one decision per call (ORT, an export again, or PyTorch, and why)
over state its methods share: the module's identities and layout, the pending backward, the measured choice.
What it compares between calls is in ``call_state.py``, its report in ``report.py``, the wording of a
fallback's reason in ``fallback_reasons.py``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch

from lightning_ort import call_state, engine, fallback_reasons
from lightning_ort.adapter import ForwardAdapter
from lightning_ort.auto_choice import PYTORCH, SpeedChoice
from lightning_ort.dataclass_io import from_mappings, to_mappings
from lightning_ort.errors import ORTFallbackError, ORTUnsupportedModelError
from lightning_ort.rank_zero import rank_zero_user_warn
from lightning_ort.report import ORTModuleReport
from lightning_ort.time_budget import time_budget

log = logging.getLogger(__name__)

FallbackMode = Literal["warn", "raise"]


_TRAINING_UNDER_NO_GRAD = (
    "a training-mode module called under no_grad (ORT's inference graph would not update BatchNorm "
    "statistics as PyTorch does; call .eval() on it, or call it with gradients)"
)
_OTHER_AUTOCAST = "called under another autocast state than the one its graph was exported with"
_MODEL_SUMMARY = "Lightning's model summary (example_input_array) hooks the submodules for their sizes"
_BEFORE_BACKWARD = " before the previous call's backward (a new export now would free the state that backward needs)"
_REPLACED_BEFORE_BACKWARD = "submodules or tensor shapes were replaced" + _BEFORE_BACKWARD
_IN_BACKWARD = (
    "called during the backward pass (a checkpoint recomputing its forward), where ORT's graph would not "
    "replay the random numbers and float rounding of the first forward"
)
_EVAL_CALL_WITH_GRAD = (
    "called in eval mode with gradients on, between training calls (each switch of train/eval modes would "
    "export ORT's training graph again; evaluate under torch.no_grad() to use ORT's inference graph)"
)
_LASTING_MODES = 3  # eval-mode calls in a row, in the same other modes, before ORT exports for them
_INPUTS_BEFORE_BACKWARD = "called with inputs of another structure, dtype, rank or requires_grad" + _BEFORE_BACKWARD
_MODES_BEFORE_BACKWARD = "submodules' train/eval modes changed" + _BEFORE_BACKWARD
_READ_BEFORE_BACKWARD = "a Python value its graph holds as a constant changed" + _BEFORE_BACKWARD
# ORT calls after an export for a changed Python value before another such export; a value that changes
# more often (every step) sends the module to PyTorch, where exporting on every change would cost more
_CALLS_BETWEEN_READ_EXPORTS = 10
_SIZES_BEFORE_BACKWARD = "a branch on sizes went the other way" + _BEFORE_BACKWARD
# Exports for branches on sizes per module; past them, calls whose sizes the graph does not hold run in PyTorch
_MAX_SIZE_EXPORTS = 8

# Pickles of a guard (a whole LightningModule saved with torch.save) from before call_state.py name this function here
_own_forward = call_state.own_forward

BreakDown = Callable[["ORTGuard"], list[str]]
"""Called when ORT gives up on a guard's training graph; wraps submodules in ORT and returns their names."""


class ORTGuard:
    """Callable installed as ``owner.forward``: ORT when it can, PyTorch with one warning when it cannot."""

    def __init__(
        self,
        name: str,
        owner: torch.nn.Module,
        runtime_options: engine.ORTRuntimeOptions,
        fallback: FallbackMode,
        break_down: BreakDown | None = None,
        warned: set[str] | None = None,
        export_timeout: float | None = None,
        choice: SpeedChoice | None = None,
    ) -> None:
        self.owner = owner
        self._choice = choice  # mode="auto": which path each call takes
        self.report = ORTModuleReport(name, parameters=call_state.trainable_parameters(owner))
        self._fallback = fallback
        self._break_down = break_down
        self._warned = warned if warned is not None else set()  # reasons already warned about, shared by a run
        self._export_timeout = export_timeout
        self._exports_due = {True, False}  # the graphs (training: True) whose next call exports them
        self._torch_forward = type(owner).forward.__get__(owner)
        self._adapter = ForwardAdapter.for_module(owner)
        self._ort_module: torch.nn.Module | None = engine.wrap_module(self._adapter, runtime_options)
        self._batch_norms = engine.batch_counters(owner)
        self._graph_autocast: dict[bool, tuple[bool, torch.dtype]] = {}
        self._graph_modes: dict[bool, tuple[bool, ...]] = {}
        self._identities: tuple[int, ...] | None = None  # of the submodules, parameters and buffers ORT reads
        self._other_modes: tuple[tuple[bool, ...], int] | None = None  # of eval-mode calls with gradients on
        self._inputs: tuple[Any, ...] | None = None  # what of the training graph's inputs makes ORT export again
        self._layout: tuple[Any, ...] = ()
        self._read_export_call: int | None = None  # ort_calls when a changed Python value was last exported

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        """A copy of the owner (an EMA or teacher snapshot a callback takes) trains in PyTorch: its ``forward`` is
        its class's, bound to it, not a guard sharing this one's ORT graphs."""
        copied_owner = memo.get(id(self.owner))
        return self if copied_owner is None else call_state.own_forward(copied_owner)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled with its owner (``torch.save(pl_module)`` during fit), it comes back as the owner's own
        ``forward``: ORT's session cannot be pickled, and the copy trains in PyTorch."""
        return call_state.own_forward, (self.owner,)

    @property
    def ort_module(self) -> torch.nn.Module | None:
        """The ORTModule running this module, or ``None`` after teardown."""
        return self._ort_module

    def _gave_up(self, training: bool) -> bool:
        return (self.report.fallback_reason if training else self.report.eval_fallback_reason) is not None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
            # the user's own export during fit (to_onnx in a callback) traces PyTorch's forward; through ORT it
            # failed, and the failure cost the module its ORT graph for the rest of the run
            return self._torch_forward(*args, **kwargs)
        training = self.owner.training
        # ORT's training graph whenever autograd records (a module in eval mode still trains, as in
        # PyTorch); under no_grad a training-mode module would run ORT's inference graph, which would
        # not update BatchNorm's counters as PyTorch does.
        graph = torch.is_grad_enabled()
        if self._choice is not None and not self._gave_up(graph) and not self.report.submodules:
            chosen = self._by_choice(training and graph)
            if chosen is not None:
                return self._in_pytorch(chosen, args, kwargs)
        if self._ort_module is None or self._gave_up(graph) or self.report.submodules:
            self.report.torch_calls += 1
            return self._torch_forward(*args, **kwargs)
        if torch._C._current_autograd_node() is not None:
            return self._in_pytorch(_IN_BACKWARD, args, kwargs)
        if training and not graph:
            return self._in_pytorch(_TRAINING_UNDER_NO_GRAD, args, kwargs)
        # The graph bakes in the autocast casts it was exported with; ORT does not re-export when
        # autocast changes, so a call under another autocast state runs in PyTorch.
        autocast = call_state.autocast_state()
        if self._graph_autocast.setdefault(graph, autocast) != autocast:
            return self._in_pytorch(_OTHER_AUTOCAST, args, kwargs)
        # The graph also bakes in every submodule's train/eval mode (a BatchNorm frozen in eval mode
        # mid-training, for instance); another combination needs a new export.
        modules = list(self.owner.modules())
        modes = tuple(module.training for module in modules)
        if self._graph_modes.setdefault(graph, modes) != modes:
            if graph and not training and not self._lasting_modes(modes):
                return self._in_pytorch(_EVAL_CALL_WITH_GRAD, args, kwargs)
            if graph and engine.backward_pending(self._ort_module):
                # a new graph now would free the state that forward's backward needs (SIGSEGV)
                return self._in_pytorch(_MODES_BEFORE_BACKWARD, args, kwargs)
            log.info("lightning_ort: train/eval modes in %s changed; ORT exports it again", self.report.name)
            self._export_again(graph)
            self._graph_modes[graph] = modes
        self._other_modes = None
        if engine.summary_hooks(modules):
            return self._in_pytorch(_MODEL_SUMMARY, args, kwargs)
        identities = call_state.identities(modules)
        if identities != self._identities:
            if self._identities is None:
                self._layout = call_state.layout(modules)
            elif not self._take_new_state(modules, graph):
                return self._in_pytorch(_REPLACED_BEFORE_BACKWARD, args, kwargs)
            self._identities = identities
        ort_args, ort_kwargs = to_mappings(args), to_mappings(kwargs)
        if graph:
            inputs = call_state.input_structure(ort_args, ort_kwargs)
            if self._inputs not in (None, inputs) and engine.backward_pending(self._ort_module):
                # two calls of one step with other inputs (model(x), then model(x, mask)): an export now
                # would free the first call's state (a segmentation fault in its backward)
                return self._in_pytorch(_INPUTS_BEFORE_BACKWARD, args, kwargs)
            self._inputs = inputs
        changed = engine.changed_python_read(self._adapter)
        if changed is not None and self._read_may_export_again():
            if engine.backward_pending(self._ort_module):
                return self._in_pytorch(_READ_BEFORE_BACKWARD, args, kwargs)
            self._export_again_for_read(changed)
            changed = None
        sizes = engine.changed_size_decision(self._adapter, graph, ort_args, ort_kwargs)
        if sizes is not None:
            if graph and engine.backward_pending(self._ort_module):
                return self._in_pytorch(_SIZES_BEFORE_BACKWARD, args, kwargs)
            if self.report.size_exports >= _MAX_SIZE_EXPORTS:
                return self._in_pytorch(
                    f"{sizes.split(' (')[0]}, after {_MAX_SIZE_EXPORTS} exports for such", args, kwargs
                )
            log.info("lightning_ort: in %s, %s; ORT exports it again", self.report.name, sizes)
            engine.forget_size_decisions(self._adapter, graph)
            self._export_again(graph)
            self.report.size_exports += 1
        engine.set_training_flag(self._ort_module, graph, training)
        budget = self._export_timeout if graph in self._exports_due else None
        start = time.perf_counter()
        try:
            self._check_python_state(modules, changed)
            with time_budget(budget, f"`{self.report.name}`"):
                output = from_mappings(self._ort_module(*ort_args, **ort_kwargs), inputs=(args, kwargs))
        except Exception as error:
            self._give_up(error, graph, autocast)
            self.report.torch_calls += 1
            return self._torch_forward(*args, **kwargs)
        if graph and self.report.first_call_seconds is None:
            self.report.first_call_seconds = time.perf_counter() - start
        self._exports_due.discard(graph)
        # each layer in train mode, also in the inference graph (test-time adaptation of BatchNorm under no_grad)
        engine.advance_batch_counters(self._batch_norms)
        engine.refresh_hooked_weights(modules)
        self.report.ort_calls += 1
        return output

    def _export_again(self, graph: bool) -> None:
        assert self._ort_module is not None
        engine.export_again(self._ort_module, graph)
        self._exports_due.add(graph)

    def _by_choice(self, training_call: bool) -> str | None:
        """mode="auto": why this call runs in PyTorch, or ``None``; ORT's graphs are dropped once PyTorch is chosen
        and no backward of theirs is pending."""
        assert self._choice is not None
        reason = self._choice.pytorch_reason(training_call)
        self.report.auto_choice = self._choice.chosen
        self.report.measured_speedup = self._choice.speedup
        if (
            self._choice.chosen == PYTORCH
            and self._ort_module is not None
            and not engine.backward_pending(self._ort_module)
        ):
            self._ort_module = None
        return reason

    def _lasting_modes(self, modes: tuple[bool, ...]) -> bool:
        """Whether an eval-mode call with gradients on, in modes other than the training graph's, is part of a
        lasting switch (the same modes on several calls in a row) that is worth a new export, rather than a
        call now and then between training calls (a callback evaluating without no_grad)."""
        other, count = self._other_modes or (modes, 0)
        count = count + 1 if other == modes else 1
        self._other_modes = (modes, count)
        return count >= _LASTING_MODES

    def _take_new_state(self, modules: list[torch.nn.Module], graph: bool) -> bool:
        """Give ORT the submodules, parameters and buffers replaced since the last call (a buffer assigned
        anew, ``self.center = ...``): ORT reads them again when only the tensor objects changed, and exports
        again when a submodule or a tensor's shape did. False when that has to wait for a pending backward."""
        assert self._ort_module is not None
        layout = call_state.layout(modules)
        if layout != self._layout:
            if graph and engine.backward_pending(self._ort_module):
                return False
            log.info(
                "lightning_ort: submodules, their code or tensor shapes in %s were replaced; ORT exports it again",
                self.report.name,
            )
            for either in (True, False):
                self._export_again(either)
            self._layout = layout
        self._adapter.take_owner_state()
        engine.read_module_tensors_again(self._ort_module)
        return True

    def _in_pytorch(self, reason: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """This one call in PyTorch, ORT's graphs kept for the next."""
        if reason not in self.report.torch_call_reasons:
            log.info("lightning_ort: PyTorch runs calls of %s: %s", self.report.name, reason)
        self.report.torch_call_reasons[reason] = self.report.torch_call_reasons.get(reason, 0) + 1
        self.report.torch_calls += 1
        return self._torch_forward(*args, **kwargs)

    def _read_may_export_again(self) -> bool:
        """Whether a Python value the graphs hold as a constant, changed (a callback's new temperature,
        ``BaseFinetuning`` toggling ``track_running_stats``), gets ORT's graphs exported again: not within
        a few calls of the last such export (``_check_python_state`` then refuses it)."""
        last = self._read_export_call
        return last is None or self.report.ort_calls - last >= _CALLS_BETWEEN_READ_EXPORTS

    def _export_again_for_read(self, changed: str) -> None:
        assert self._ort_module is not None
        log.info("lightning_ort: in %s, %s; ORT exports it again", self.report.name, changed.split("; ")[0])
        engine.forget_python_reads(self._adapter)
        for either in (True, False):
            self._export_again(either)
        self._read_export_call = self.report.ort_calls

    def _check_python_state(self, modules: list[torch.nn.Module], changed: str | None) -> None:
        """Raise if Python state the graph cannot follow changed since the export: a value the export
        read (``changed``, the reason), again soon after the last export for such a change, or a forward
        hook registered on a submodule (such hooks run during the export only)."""
        problem = changed
        if problem is not None:
            again = (
                f", and it changed again within {_CALLS_BETWEEN_READ_EXPORTS} calls of ORT's export for its last "
                "change (exporting on nearly every call would cost more than PyTorch). Fix:"
            )
            problem = problem.replace(". Fix:", again, 1)
        problem = problem or engine.hooks_problem(self.owner, modules)
        if problem is not None:
            raise ORTUnsupportedModelError(problem)

    def _give_up(self, error: Exception, training: bool, autocast: tuple[bool, torch.dtype]) -> None:
        reason = fallback_reasons.reason(error)
        dtype = f"tensor({str(autocast[1]).removeprefix('torch.')})"
        if autocast[0] and ("Could not find an implementation" in reason or (dtype in reason and "invalid" in reason)):
            reason += (
                f" (under {autocast[1]} autocast: this ORT build has no {autocast[1]} kernel for the op; "
                "precision='32-true' keeps the module in ORT)"
            )
        reason += fallback_reasons.hints(reason)
        graph = "training" if training else "inference"
        if training:
            self.report.fallback_reason = reason
        else:
            self.report.eval_fallback_reason = reason
        if self._fallback == "raise":
            raise ORTFallbackError(
                f"ORT cannot run `{self.report.name}` ({type(self.owner).__name__}) in its {graph} graph: {reason}. "
                "Fix: change the module, or pass ORTStrategy(fallback='warn') to run it in PyTorch."
            ) from error
        log.debug("ORT failure for %s", self.report.name, exc_info=error)
        if training and self._break_down is not None:
            self.report.submodules = self._break_down(self)
        where = f"`{self.report.name}` ({type(self.owner).__name__})"
        if self.report.submodules:
            parts = self.report.submodules
            listed = ", ".join(f"`{name}`" for name in parts[:6])
            listed += f" and {len(parts) - 6} more" if len(parts) > 6 else ""
            outcome = f"ORT runs its submodules {listed} instead, the code between them in PyTorch"
        else:
            outcome = f"PyTorch runs it in {'training' if training else 'eval/no-grad'} mode from now on"
        message = f"lightning_ort: ORT cannot run {where} in its {graph} graph; {outcome}. Reason: {reason}"
        if reason in self._warned:  # the same reason in another block of the model: said once already
            log.info(message)
            return
        self._warned.add(reason)
        rank_zero_user_warn(message)

    @contextlib.contextmanager
    def bypassed(self) -> Iterator[None]:
        """Inside the block ``owner(...)`` runs the owner class's own forward in PyTorch (nothing is counted)."""
        installed = self.owner.__dict__.get("forward") is self
        if installed:
            del self.owner.__dict__["forward"]
        try:
            yield
        finally:
            if installed:
                self.owner.forward = self  # type: ignore[method-assign]

    def install(self) -> None:
        """Route ``owner(...)`` through this guard."""
        self.owner.forward = self  # type: ignore[method-assign]

    def uninstall(self) -> None:
        """Give the owner its own ``forward`` back and drop ORT's graphs."""
        if self.owner.__dict__.get("forward") is self:
            del self.owner.__dict__["forward"]
        self._ort_module = None
