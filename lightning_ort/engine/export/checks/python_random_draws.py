"""Random numbers a traced forward draws from Python's ``random`` or NumPy's ``np.random``.

The export runs ``forward`` once; the trace keeps the number drawn then, and whatever branch it chose
(fairseq's LayerDrop, ``if np.random.random() < self.layerdrop: continue``; stochastic depth written
with ``random.random()``; ``random.choice`` of a scale). ORT would then take that branch or value at
every step where eager draws again: silently wrong training (weights 0.05-0.06 off after eight
steps). torch's own generator is another matter: ``torch.rand`` stays a random node of the graph.
While the export traces, :func:`random_draws` records where the user's code calls the module-level
functions of ``random`` and ``numpy.random`` (a function bound before the export, ``from random
import random``, is not seen).
"""

from __future__ import annotations

import contextlib
import functools
import random
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from lightning_ort.engine.export.checks.export_check import ExportCheck, ExportContext, Recorder
from lightning_ort.engine.export.user_code import user_frame

_PYTHON = (
    "random", "uniform", "randint", "randrange", "choice", "choices", "sample", "shuffle", "gauss",
    "normalvariate", "lognormvariate", "expovariate", "betavariate", "gammavariate", "triangular", "getrandbits",
)  # fmt: skip
_NUMPY = (
    "random", "rand", "randn", "randint", "random_sample", "uniform", "normal", "standard_normal", "choice",
    "permutation", "shuffle", "binomial", "beta", "poisson", "exponential", "gamma", "bernoulli",
)  # fmt: skip


def _sources() -> list[tuple[types.ModuleType, tuple[str, ...]]]:
    sources: list[tuple[types.ModuleType, tuple[str, ...]]] = [(random, _PYTHON)]
    with contextlib.suppress(ImportError):
        import numpy.random

        sources.append((numpy.random, _NUMPY))
    return sources


@contextlib.contextmanager
def random_draws(locate: Callable[[], str | None]) -> Iterator[list[str]]:
    """Within the block, the ``file:line`` (``locate()``) of each draw while a trace is open, once each."""
    seen: list[str] = []

    def watched(module_name: str, name: str, original: Any) -> Any:
        @functools.wraps(original)
        def draw(*args: Any, **kwargs: Any) -> Any:
            if torch.jit.is_tracing():
                location = locate()
                entry = f"{location} ({module_name}.{name})"
                if location is not None and entry not in seen:
                    seen.append(entry)
            return original(*args, **kwargs)

        return draw

    patched: list[tuple[types.ModuleType, str, Any]] = []
    for module, names in _sources():
        for name in names:
            original = getattr(module, name, None)
            if callable(original):
                patched.append((module, name, original))
                setattr(module, name, watched(module.__name__, name, original))
    try:
        yield seen
    finally:
        for module, name, original in patched:
            setattr(module, name, original)


RANDOM_DRAWS = Recorder("random_draws", lambda context: random_draws(user_frame))


def _random_draws(context: ExportContext) -> str | None:
    draws = context[RANDOM_DRAWS]
    if not draws:
        return None
    return (
        f"its forward draws a Python or NumPy random number at {draws[0]}; the export keeps the number drawn "
        "then, so every later step would take the same branch or value. Fix: draw with torch inside the "
        "computation (torch.rand(()) < p as a tensor mask, nn.Dropout), pass the number to forward as a tensor, "
        "or keep that module out of ORT with ORTStrategy(modules=[...])"
    )


PYTHON_RANDOM_DRAWS = ExportCheck("python_random_draws", _random_draws, reads=(RANDOM_DRAWS,))
