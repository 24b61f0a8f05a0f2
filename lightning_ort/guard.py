"""Runs one module's forward through ORT, or through PyTorch once ORT has given up on it."""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.utils import _pytree

from lightning_ort import engine
from lightning_ort.adapter import ForwardAdapter
from lightning_ort.auto_choice import PYTORCH, SpeedChoice
from lightning_ort.dataclass_io import from_mappings, to_mappings
from lightning_ort.errors import ORTFallbackError, ORTUnsupportedModelError
from lightning_ort.rank_zero import rank_zero_user_warn
from lightning_ort.time_budget import time_budget

log = logging.getLogger(__name__)

FallbackMode = Literal["warn", "raise"]


@dataclass
class ORTModuleReport:
    """What happened to one wrapped module during a run.

    ORT builds separate graphs for training and for inference (eval mode or no grad), and either
    can be given up on its own.

    Attributes:
        name: where the module sits in the LightningModule (``"forward"`` for the LightningModule's own forward).
        ort_calls: forward calls ORT executed.
        torch_calls: forward calls PyTorch executed instead.
        fallback_reason: why ORT's training graph was given up, or ``None``.
        eval_fallback_reason: why ORT's inference graph was given up, or ``None``.
        torch_call_reasons: why single calls ran in PyTorch while ORT kept both graphs (a training-mode
            module under ``no_grad``, another autocast state), with how many calls each.
        parameters: the module's trainable parameters (elements) when it was wrapped.
        submodules: after ORT gave up on the module's training graph, the submodules ORT runs instead
            (each with a report of its own); the module's own code between them runs in PyTorch.
        size_exports: exports again because a Python branch on sizes went the other way for a call's
            input sizes than in the graph's export (``engine/export/size_guards.py``).
        auto_choice: under ``ORTStrategy(mode="auto")``, the path the measurement chose (``"ort"`` or
            ``"pytorch"``), ``None`` while measuring or under ``mode="ort"``.
        measured_speedup: under ``mode="auto"``, ORT's measured speed relative to PyTorch's on this module
            (PyTorch's median step over ORT's; above 1: ORT faster).
        first_call_seconds: the wall time of ORT's first training call of this module (its forward, with the
            export and the graph builds), ``None`` before it.
    """

    name: str
    ort_calls: int = 0
    torch_calls: int = 0
    fallback_reason: str | None = None
    eval_fallback_reason: str | None = None
    torch_call_reasons: dict[str, int] = field(default_factory=dict)
    parameters: int = 0
    submodules: list[str] = field(default_factory=list)
    size_exports: int = 0
    auto_choice: str | None = None
    measured_speedup: float | None = None
    first_call_seconds: float | None = None

    @property
    def uses_ort(self) -> bool:
        """Whether ORT still runs this module in both modes."""
        return self.fallback_reason is None and self.eval_fallback_reason is None and self.auto_choice != PYTORCH


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

# What some errors of ORT and of torch's export mean for the user's module, and the fix
_COMPLEX = (
    "the forward computes with complex tensors (torch.view_as_complex or torch.polar, as rotary embeddings in "
    "their complex form do), which ORT cannot hold. Fix: rotate with real tensors (x * cos + rotate_half(x) * sin), "
    "or keep that module out of ORT with ORTStrategy(modules=[...])"
)
_HINTS = (
    (
        "Cannot split using values in 'split' attribute",
        "the forward splits a dimension whose size changed since the export, as x.unbind(1) or x.split(1, dim=1) "
        "over the sequence length do; the exported graph keeps the first batch's number of parts. Fix: use tensor "
        "operations over the whole dimension, or batches of one length",
    ),
    (
        "cond must be a bool, but got a Tensor",
        "a check in torch's Python code compared sizes the export traces as tensors (F.max_unpool2d's output "
        "size check does). Fix: keep that layer out of ORT with ORTStrategy(modules=[...])",
    ),
    (
        "as it's unreachable",
        "ORT found no gradient path from the outputs to a parameter that requires grad, through an op that "
        "carries no gradient. Fix: freeze the parameter with requires_grad_(False), which ORT leaves out, or "
        "register it as a buffer, or keep that part out of ORT with ORTStrategy(modules=[...])",
    ),
    (
        "cannot register a hook on a tensor that doesn't require gradient",
        "the forward registers a gradient hook on a tensor; ORT runs the forward with gradients off to export it, "
        "and computes the gradients of its graph in one piece without calling Python hooks. Fix: register the hook "
        "on a tensor forward returns and nothing inside forward uses, or keep that module out of ORT with "
        "ORTStrategy(modules=[...])",
    ),
    (
        "Cannot insert a Tensor that requires grad as a constant",
        "the forward uses a tensor that requires grad and is neither a parameter nor a buffer of the module ORT "
        "runs (a parameter of another module reached through a closure or a global, one kept in a Python list "
        "or dict); ORT's graph could hold it only as a constant, without its gradient. Fix: make it part of the "
        "module (an nn.Parameter attribute, nn.ParameterList or nn.ParameterDict), or keep that module out of "
        "ORT with ORTStrategy(modules=[...])",
    ),
    (
        "HandleBroadcasting",
        "ORT's gradient builder could not work out the shapes of a broadcast, typically a matmul whose batch "
        "dimensions broadcast against sizes it cannot follow (W(1, N, ...) @ u(B, N, ...)). Fix: expand the "
        "operand first (W.expand(B, -1, ...)), or keep that module out of ORT with ORTStrategy(modules=[...])",
    ),
    ("ComplexFloat is an unexpected tensor scalar type", _COMPLEX),
    ("'aten::polar'", _COMPLEX),
    ("'aten::view_as_complex'", _COMPLEX),
    (
        "Argument types: Tensor, bool",
        "the forward uses a bool in tensor arithmetic (h * flag, a bool argument of forward included), which "
        "torch's export cannot trace. Fix: convert it first (h * float(flag)), or branch on it (if flag: ...)",
    ),
)

# The line naming the exception in a traceback ORT embeds in its own error text
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")


def _reason(error: BaseException) -> str:
    """One readable line out of ORT's (often multi-page) error text."""
    root: BaseException = error
    while root.__cause__ is not None:
        root = root.__cause__
    lines = [line.strip() for line in str(root).splitlines() if line.strip()]
    raised = [line for line in lines[1:] if _RAISED.match(line)]
    text = raised[-1] if raised else (lines[-1] if lines else "")
    # ORT's C++ checks read "<file>:<line> <function signature> <condition> was false. <message>"
    _, checked, message = text.partition(" was false. ")
    if checked:
        text = message
    if len(lines) > 1 and lines[0] not in text:
        text = f"{lines[0][:200]} ... {text}"
    return f"{type(root).__name__}: {text[:600]}"


def _input_structure(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """What of a call's inputs ORT exports or builds its gradient graph again for: their nesting, each
    tensor's dtype, rank, device and ``requires_grad``, each bool's value (Python numbers are fed as
    tensors), the type of anything else."""
    leaves, spec = _pytree.tree_flatten((args, kwargs))
    return spec, tuple(
        (leaf.dtype, leaf.dim(), leaf.device, leaf.requires_grad)
        if isinstance(leaf, torch.Tensor)
        else leaf
        if leaf is None or isinstance(leaf, (bool, str))
        else type(leaf)
        for leaf in leaves
    )


def _autocast_state() -> tuple[bool, torch.dtype]:
    for device in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device):
            return True, torch.get_autocast_dtype(device)
    return False, torch.float32


def _module_tensors(modules: list[torch.nn.Module]) -> Iterator[torch.Tensor | None]:
    for module in modules:
        yield from module._parameters.values()
        yield from module._buffers.values()


def _code(modules: list[torch.nn.Module]) -> Iterator[int]:
    """The submodules' classes and the ``forward`` set on an instance, if any: the code the export traced."""
    for module in modules:
        yield id(type(module))
        yield id(module.__dict__.get("forward"))


def _identities(modules: list[torch.nn.Module]) -> tuple[int, ...]:
    return (*map(id, modules), *_code(modules), *map(id, _module_tensors(modules)))


def _layout(modules: list[torch.nn.Module]) -> tuple[Any, ...]:
    """What ORT's graph depends on of the submodules (their code too), parameters and buffers (not the
    tensor objects)."""
    return (
        *map(id, modules),
        *_code(modules),
        *((None if value is None else (value.shape, value.dtype, value.device)) for value in _module_tensors(modules)),
    )


def _own_forward(owner: torch.nn.Module) -> Any:
    return type(owner).forward.__get__(owner)


def trainable_parameters(module: torch.nn.Module) -> int:
    """Elements of the module's parameters that require grad (a parameter shared by two submodules counts once)."""
    return sum(parameter.numel() for parameter in module.parameters() if parameter.requires_grad)


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
        self.report = ORTModuleReport(name, parameters=trainable_parameters(owner))
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
        return self if copied_owner is None else _own_forward(copied_owner)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled with its owner (``torch.save(pl_module)`` during fit), it comes back as the owner's own
        ``forward``: ORT's session cannot be pickled, and the copy trains in PyTorch."""
        return _own_forward, (self.owner,)

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
        autocast = _autocast_state()
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
        identities = _identities(modules)
        if identities != self._identities:
            if self._identities is None:
                self._layout = _layout(modules)
            elif not self._take_new_state(modules, graph):
                return self._in_pytorch(_REPLACED_BEFORE_BACKWARD, args, kwargs)
            self._identities = identities
        ort_args, ort_kwargs = to_mappings(args), to_mappings(kwargs)
        if graph:
            inputs = _input_structure(ort_args, ort_kwargs)
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
        layout = _layout(modules)
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
        reason = _reason(error)
        dtype = f"tensor({str(autocast[1]).removeprefix('torch.')})"
        if autocast[0] and ("Could not find an implementation" in reason or (dtype in reason and "invalid" in reason)):
            reason += (
                f" (under {autocast[1]} autocast: this ORT build has no {autocast[1]} kernel for the op; "
                "precision='32-true' keeps the module in ORT)"
            )
        reason += "".join(f" ({hint})" for symptom, hint in _HINTS if symptom in reason)
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
