"""``rank_zero_user_warn``: Lightning's ``rank_zero_warn``, pointed at the user's line instead of the library's.

A warning about the user's model (ORT gave up on a module) raised with a fixed ``stacklevel`` names
whichever library frame happens to be that many calls up (``lightning_ort/guard.py``, torch's
``Module._call_impl``); this one names the first frame outside lightning_ort, torch, Lightning,
ONNX Runtime and the standard library, e.g. the ``self(x)`` in the user's ``training_step``.
"""

from __future__ import annotations

import sys
import warnings
from types import FrameType

from lightning.pytorch.utilities.rank_zero import rank_zero_only

__all__ = ["rank_zero_user_warn", "user_frame"]

# Top-level packages between the user's code and a warning raised inside lightning_ort.
LIBRARIES = frozenset(
    {
        "lightning_ort",
        "torch",
        "lightning",
        "pytorch_lightning",
        "lightning_fabric",
        "lightning_utilities",
        "onnxruntime",
        "onnx",
        "jsonargparse",
        "typing_extensions",
    }
)


def _is_library(frame: FrameType) -> bool:
    package = str(frame.f_globals.get("__name__", "")).partition(".")[0]
    return package in LIBRARIES or package in sys.stdlib_module_names


def user_frame(frame: FrameType | None = None) -> FrameType | None:
    """The innermost frame, from ``frame`` (default: the caller's) outwards, whose module belongs to none of
    :data:`LIBRARIES` nor the standard library; ``None`` if every frame does."""
    frame = frame if frame is not None else sys._getframe(1)
    while frame is not None and _is_library(frame):
        frame = frame.f_back
    return frame


@rank_zero_only
def rank_zero_user_warn(message: str, category: type[Warning] = UserWarning) -> None:
    """Warn on rank zero as ``rank_zero_warn`` does, at the user's line (:func:`user_frame`) when there is one."""
    frame = user_frame(sys._getframe(1))
    if frame is None:
        warnings.warn(message, category, stacklevel=3)  # the caller's caller: rank_zero_only wraps this function
        return
    where = (message, category, frame.f_code.co_filename, frame.f_lineno)
    module = str(frame.f_globals.get("__name__", ""))
    registry = frame.f_globals.setdefault("__warningregistry__", {})
    try:
        warnings.warn_explicit(*where, module=module, registry=registry, module_globals=frame.f_globals)
    except ImportError:  # code run by `python -c`: its loader cannot give the line's source
        warnings.warn_explicit(*where, module=module, registry=registry)
