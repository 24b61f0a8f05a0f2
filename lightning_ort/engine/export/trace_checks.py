"""Module patterns a traced ONNX graph cannot reproduce, found around ORT's export.

Each one trained silently differently from eager PyTorch before it was checked:

- a tensor turned into a Python integer by ``__index__`` (``for t in range(x.shape[1])``, a list
  index): under the tracer a size is a tensor, and ``range()`` reads it without the warning
  ``int()`` gives, so a loop over the sequence length stayed unrolled for the first batch's length;
- Python forward hooks and pre-hooks on submodules: they run during the export only, so features
  captured by a hook were stale (weight normalisation and pruning hooks, which compute a weight
  from parameters, become part of the graph and are fine);
- iteration over a tensor's dimension whose size can change (``for row in x``): the trace holds one
  part per element of the first batch, and where no part reaches the graph (``sum(1 for _ in x)``)
  the frozen count went unnoticed. Iterating over a constant size (``q, k, v = qkv``) is allowed.

``traced_calls.py`` finds the patterns that need every torch call's arguments (pooling sizes, splits
counted but unused). The refusals, with their messages, are the export checks in ``checks/``
(``frozen_numbers.py``); parameters and inputs changed in place, sparse embeddings and the like are
checked there too.
"""

from __future__ import annotations

import contextlib
import dis
import functools
import linecache
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.nn.utils import prune
from torch.nn.utils.weight_norm import WeightNorm

from lightning_ort.engine.export.fixed_sizes import fixed_number, fixed_size
from lightning_ort.engine.export.traced_calls import TracedCalls
from lightning_ort.engine.export.tracing_state import untraced, warned_at_caller
from lightning_ort.engine.export.value_traces import value_trace

_SUBSCRIPTS = {"BINARY_SUBSCR", "STORE_SUBSCR", "BINARY_SLICE", "STORE_SLICE"}
# An f-string's formatting of a value (3.10-3.12; 3.13's), and the calls whose message a formatted size may be
_FORMATTING = {"FORMAT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC", "CONVERT_VALUE"}
_MESSAGE_CALLS = ("_assert(", "assert ", "raise ", "warn(", "warning(", "print(", "log(", "debug(", "info(")
# Hooks that compute a weight from parameters before each forward: the trace records the computation.
_TRACEABLE_HOOKS = (WeightNorm, prune.BasePruningMethod)
_SUMMARY_MODULE = "lightning.pytorch.utilities.model_summary"


@contextlib.contextmanager
def index_conversions(locate: Callable[[], str | None]) -> Iterator[list[str]]:
    """Where (``locate()`` of the caller, e.g. ``file:line``) traced code called ``Tensor.__index__``."""
    seen: list[str] = []
    original = torch.Tensor.__index__

    def __index__(self: torch.Tensor) -> int:
        caller = sys._getframe(1)
        if torch.jit.is_tracing() and not _in_subscript(caller) and not _in_message(caller):
            location = locate()
            if location is not None and location not in seen:
                seen.append(location)
        return original(self)

    torch.Tensor.__index__ = __index__  # type: ignore[method-assign,assignment]
    try:
        yield seen
    finally:
        torch.Tensor.__index__ = original  # type: ignore[method-assign]


# Functions taking kernel, stride or output sizes as int[N], where a size read from the input (the
# length of a sequence) is the natural argument.
@contextlib.contextmanager
def varying_iterations(locate: Callable[[], str | None]) -> Iterator[list[str]]:
    """Where (``locate()`` of the caller) traced code iterated over a tensor (``q, k, v = qkv``, ``for row
    in x``) whose first dimension's size :func:`fixed_size` cannot show to be constant.

    ``Tensor.__iter__`` is ``iter(self.unbind(0))``: the trace holds one part per element of the first
    batch. When some part is used, ORT's ``Split`` fails loudly on a batch of another size; when none is
    (``sum(1 for _ in x)``, ``for i, _ in enumerate(x)``) the Python count alone stays frozen, silently.
    Over a constant size the count cannot change. The TracerWarning ``__iter__`` gives is left out: the
    guard refuses the recorded iterations with a reason of its own."""
    seen: list[str] = []
    original = torch.Tensor.__iter__

    def __iter__(self: torch.Tensor) -> Iterator[torch.Tensor]:
        if not torch.jit.is_tracing() or self.dim() == 0:
            return original(self)
        value = value_trace(self)
        if value is not None and not fixed_size(value, 0):
            location = locate()  # None inside torch's own code, whose warnings the guard ignored before
            if location is not None and location not in seen:
                seen.append(location)
        return iter(self.unbind(0))  # what Tensor.__iter__ does, without its warning

    torch.Tensor.__iter__ = __iter__  # type: ignore[method-assign,assignment]
    try:
        yield seen
    finally:
        torch.Tensor.__iter__ = original  # type: ignore[method-assign]


@contextlib.contextmanager
def fixed_size_numbers() -> Iterator[None]:
    """Within the block, ``float()`` and ``int()`` of a traced size of a dimension :func:`fixed_size`
    shows to be constant (minGPT's ``1.0 / math.sqrt(k.size(-1))``, a head's width) give the number
    without torch's TracerWarning, which the guard refuses: no input's size can change it, so the
    trace may hold it as a constant. Other conversions are left to torch, and its warning names the
    code that converted."""
    originals = {name: getattr(torch.Tensor, name) for name in ("__float__", "__int__")}

    def constant_size(original: Any) -> Any:
        @functools.wraps(original)
        def convert(self: torch.Tensor) -> Any:
            if torch.jit.is_tracing() and self.dim() == 0 and _is_fixed_size_read(self):
                with untraced():
                    return original(self)
            if not torch.jit.is_tracing():
                return original(self)
            return warned_at_caller(original, self)

        return convert

    for name, original in originals.items():
        setattr(torch.Tensor, name, constant_size(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def _is_fixed_size_read(tensor: torch.Tensor) -> bool:
    """Whether the traced 0-d ``tensor`` is computed from constants and sizes of fixed-size dimensions only
    (``x.size(-1)``, ``C // n_head``)."""
    value = value_trace(tensor)
    return value is not None and fixed_number(value)


_HOOK_FILES = frozenset({__file__, TracedCalls.__torch_function__.__code__.co_filename})


def _in_message(frame: types.FrameType) -> bool:
    """Whether ``frame`` formats a size into the message of a check (torchvision's ViT: ``torch._assert(x.dim()
    == 3, f"... got {x.shape}")``): an f-string's value (formatting ``torch.Size`` reads its sizes with
    ``__index__``) on a line that asserts, raises, warns or prints. The text reaches no graph and no branch."""
    while frame.f_back is not None and frame.f_code.co_filename in _HOOK_FILES:
        frame = frame.f_back  # dispatched through traced_calls' mode (and this hook again): the f-string is further up
    if dis.opname[frame.f_code.co_code[frame.f_lasti]] not in _FORMATTING:
        return False
    first = frame.f_lineno
    lines = (linecache.getline(frame.f_code.co_filename, line) for line in range(max(1, first - 2), first + 1))
    return any(marker in line for line in lines for marker in _MESSAGE_CALLS)


def _in_subscript(frame: types.FrameType) -> bool:
    """Whether ``frame`` is subscripting (``x[:, :n]``): tensor indexing reads a traced size with
    ``__index__`` but records it in the trace as a dynamic value."""
    if frame.f_code is TracedCalls.__torch_function__.__code__ and frame.f_back is not None:
        frame = frame.f_back  # indexing dispatched through traced_calls' mode: the subscript is its caller
    return dis.opname[frame.f_code.co_code[frame.f_lasti]] in _SUBSCRIPTS


def hooked_weight_names(module: torch.nn.Module) -> set[str]:
    """The attributes ``module``'s weight normalisation and pruning hooks set before each forward (``weight``
    from ``weight_orig`` and the mask): the trace computes them inside the graph."""
    names = set()
    for hook in module._forward_pre_hooks.values():
        if isinstance(hook, prune.BasePruningMethod):
            names.add(hook._tensor_name)
        elif isinstance(hook, WeightNorm):
            names.add(hook.name)
    return names


def refresh_hooked_weights(modules: list[torch.nn.Module]) -> None:
    """Set the attributes weight normalisation and pruning hooks compute, as the forward ORT ran instead of
    PyTorch would have: code outside forward reads them (the next round of ``ModelPruning`` ranks the weights
    it finds there), and they would otherwise stay as the export left them."""
    with torch.no_grad():
        for module in modules:
            for hook in list(module._forward_pre_hooks.values()):
                if isinstance(hook, _TRACEABLE_HOOKS):
                    hook(module, ())


def tensor_version(tensor: torch.Tensor) -> int | bytes:
    """What changes when ``tensor`` is changed in place: its version counter, or the bytes of an inference
    tensor, which has none (made under ``torch.inference_mode``: torchmetrics states updated in a
    ``Trainer.validate`` or ``predict``)."""
    if tensor.is_inference():
        return tensor.detach().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()
    return tensor._version


def _forward_hooks(module: torch.nn.Module) -> list[Any]:
    return [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]


def _has_backward_hooks(module: torch.nn.Module) -> bool:
    return bool(module._backward_hooks or module._backward_pre_hooks)


def summary_hooks(modules: list[torch.nn.Module]) -> bool:
    """Whether Lightning's model summary hooks the modules (its ``example_input_array`` call): a call to run
    in PyTorch, for the summary's sizes, leaving ORT's graphs to the calls after it."""
    return any(
        getattr(hook, "__module__", "").startswith(_SUMMARY_MODULE)
        for module in modules
        if module._forward_hooks
        for hook in module._forward_hooks.values()
    )


def hooks_problem(owner: torch.nn.Module, modules: list[torch.nn.Module]) -> str | None:
    """Why Python hooks on ``owner``'s submodules (``modules``: ``owner.modules()``) would not work
    under ORT, if there are any (the owner's own hooks run around lightning_ort's forward, outside
    ORT, as in eager): forward hooks run during the export only, backward hooks never, since ORT
    computes the submodules' gradients inside its graph."""
    from torch.nn.modules import module as torch_module

    global_forward = torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks
    global_backward = torch_module._global_backward_hooks or torch_module._global_backward_pre_hooks
    # runs before every call: the common case (no hooks) without building names
    if (
        not global_forward
        and not global_backward
        and not any(
            submodule._forward_hooks or submodule._forward_pre_hooks or _has_backward_hooks(submodule)
            for submodule in modules
            if submodule is not owner
        )
    ):
        return None
    forward, backward = [], []
    for name, submodule in owner.named_modules():
        if submodule is owner:
            continue
        if any(not isinstance(hook, _TRACEABLE_HOOKS) for hook in _forward_hooks(submodule)):
            forward.append(name)
        if _has_backward_hooks(submodule):
            backward.append(name)
    fix = "Fix: return the tensors from forward instead, or keep that module out of ORT with ORTStrategy(modules=[...])"
    if backward or global_backward:
        where = (
            f"submodule(s) {', '.join(backward)}" if backward else "every module (register_module_full_backward_hook)"
        )
        return (
            f"backward hooks are registered on {where}; ORT computes the gradients of its graph in one piece "
            f"and calls no Python hook of a submodule, so the hooks would never see or change them. {fix}"
        )
    if not forward and not global_forward:
        return None
    where = f"submodule(s) {', '.join(forward)}" if forward else "every module (register_module_forward_hook)"
    return (
        f"forward hooks are registered on {where}; ORT runs the traced graph and calls no Python hook after "
        f"the export, so what a hook captures would be stale. {fix}"
    )
