"""Aliases for the torch.onnx internals that ORT 1.19.2 imports from their pre-2.6 locations."""

from __future__ import annotations

import importlib
import sys
import types

import torch.onnx
import torch.onnx._internal as _internal

_MOVED = ("jit_utils", "_globals", "_type_utils", "registration")
_NEW_HOME = "torch.onnx._internal.torchscript_exporter"
# Public modules that now re-export only the public names of their TorchScript-exporter twin; ORT
# also imports private helpers from them (e.g. symbolic_opset9._convolution).
_SHIMS = ("symbolic_helper", *(f"symbolic_opset{version}" for version in range(7, 21)))


def _forward_missing_names(shim: types.ModuleType, target: types.ModuleType) -> None:
    if hasattr(shim, "__getattr__"):
        return

    def __getattr__(name: str) -> object:
        try:
            return getattr(target, name)
        except AttributeError:
            raise AttributeError(f"module {shim.__name__!r} has no attribute {name!r}") from None

    shim.__getattr__ = __getattr__  # type: ignore[attr-defined]


def install_torch_onnx_aliases() -> None:
    """Make ``torch.onnx._internal.<name>`` importable again for the modules that moved.

    Only names that are missing get an alias, so a torch that still has them is left untouched.
    """
    for name in _MOVED:
        old = f"{_internal.__name__}.{name}"
        if old in sys.modules or hasattr(_internal, name):
            continue
        module = importlib.import_module(f"{_NEW_HOME}.{name}")
        sys.modules[old] = module
        setattr(_internal, name, module)
        if not hasattr(torch.onnx, name):
            setattr(torch.onnx, name, module)
    for name in _SHIMS:
        try:
            shim = importlib.import_module(f"torch.onnx.{name}")
            target = importlib.import_module(f"{_NEW_HOME}.{name}")
        except ImportError:
            continue
        _forward_missing_names(shim, target)
    if not hasattr(_internal, "_beartype"):
        # Only ORT's ZeRO-3 path decorates with it; an identity decorator keeps its behaviour.
        stub = types.ModuleType(f"{_internal.__name__}._beartype")
        stub.beartype = lambda fn: fn  # type: ignore[attr-defined]
        sys.modules[stub.__name__] = stub
        _internal._beartype = stub
