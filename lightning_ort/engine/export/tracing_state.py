"""Reading values during torch's trace without recording them, and torch's trace warnings at the user's line."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch


@contextlib.contextmanager
def untraced() -> Iterator[None]:
    """Inside the block torch's trace records nothing and warns nothing: a tensor read as a number is a number."""
    state = torch._C._get_tracing_state()
    torch._C._set_tracing_state(None)
    try:
        yield
    finally:
        torch._C._set_tracing_state(state)


def warned_at_caller(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``, the warnings it raises moved to the line that called the caller of this function:
    torch's C++ TracerWarning names the innermost Python frame, which is lightning_ort's wrapper, not the
    user's code that converted a tensor."""
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        result = function(*args)
    caller = sys._getframe(2)
    for record in records:
        warnings.warn_explicit(record.message, record.category, caller.f_code.co_filename, caller.f_lineno)
    return result
