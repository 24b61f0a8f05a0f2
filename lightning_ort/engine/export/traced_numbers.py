"""Where the traced forward turns a tensor, or a size (a tensor under the export), into a Python number that
the graph would freeze at the first batch's value.

Each pattern trained silently differently from eager PyTorch before it was recorded:

- a tensor turned into a Python integer by ``__index__`` (``for t in range(x.shape[1])``, a list
  index): under the tracer a size is a tensor, and ``range()`` reads it without the warning
  ``int()`` gives, so a loop over the sequence length stayed unrolled for the first batch's length;
- iteration over a tensor's dimension whose size can change (``for row in x``): the trace holds one
  part per element of the first batch, and where no part reaches the graph (``sum(1 for _ in x)``)
  the frozen count went unnoticed. Iterating over a constant size (``q, k, v = qkv``) is allowed.

:func:`fixed_size_numbers` lets Python read sizes that cannot change between batches. ``traced_calls.py``
finds the patterns that need every torch call's arguments (pooling sizes, splits counted but unused). The
refusals, with their messages, are the export checks in ``checks/frozen_numbers.py``.
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

from lightning_ort.engine.export.fixed_sizes import fixed_number, fixed_size
from lightning_ort.engine.export.traced_calls import TracedCalls
from lightning_ort.engine.export.tracing_state import untraced, warned_at_caller
from lightning_ort.engine.export.value_traces import value_trace

_SUBSCRIPTS = {"BINARY_SUBSCR", "STORE_SUBSCR", "BINARY_SLICE", "STORE_SLICE"}
# An f-string's formatting of a value (3.10-3.12; 3.13's), and the calls whose message a formatted size may be
_FORMATTING = {"FORMAT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC", "CONVERT_VALUE"}
_MESSAGE_CALLS = ("_assert(", "assert ", "raise ", "warn(", "warning(", "print(", "log(", "debug(", "info(")


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
