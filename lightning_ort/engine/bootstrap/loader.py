"""Import ``onnxruntime.training.ortmodule`` on a modern torch, once per process."""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import sys
import types
from collections.abc import Callable, Iterator

from lightning_ort.engine.bootstrap import extensions
from lightning_ort.engine.bootstrap.flavour import check_installation
from lightning_ort.engine.bootstrap.nvtx import install_cpu_nvtx
from lightning_ort.engine.bootstrap.torch_onnx import install_torch_onnx_aliases
from lightning_ort.errors import ORTSetupError

_ORTMODULE = "onnxruntime.training.ortmodule"

# Run once, after ORT's training frontend is imported: the hooks into ORT (runtime's hooks.install), which
# sit above this module and are handed in by lightning_ort's engine package instead of imported here.
_after_import: list[Callable[[], None]] = []


def run_after_import(hook: Callable[[], None]) -> None:
    """Have :func:`ortmodule_package` call ``hook()`` once ORT is imported (before it returns the package)."""
    if hook not in _after_import:
        _after_import.append(hook)


@contextlib.contextmanager
def _scoped_env(**values: str) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


@contextlib.contextmanager
def _root_logger_untouched() -> Iterator[None]:
    """ORT's modules call ``logging.basicConfig`` at import, which would restyle the user's logs."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)


@functools.cache
def ortmodule_package() -> types.ModuleType:
    """Return ``onnxruntime.training.ortmodule``, made importable and usable on this torch."""
    with _root_logger_untouched():
        return _load_ortmodule()


def _load_ortmodule() -> types.ModuleType:
    check_installation()
    install_torch_onnx_aliases()
    install_cpu_nvtx()
    extensions.register_extensions()
    # A failed earlier import (e.g. by `import onnxruntime.training` before the aliases existed)
    # leaves nothing behind in sys.modules, so this import starts clean.
    # ORT reads this switch once, when `_custom_autograd_function` is first imported; importing with
    # custom autograd.Function support off keeps the import from compiling lightning_ort's runner
    # extension. `custom_function.custom_function_support()` turns it on afterwards.
    with _scoped_env(ORTMODULE_ENABLE_CUSTOM_AUTOGRAD="0"):
        try:
            package = importlib.import_module(_ORTMODULE)
            importlib.import_module(f"{_ORTMODULE}._custom_autograd_function")
        except ImportError as err:
            raise ORTSetupError(
                f"onnxruntime.training.ortmodule failed to import on torch {_torch_version()}: {err}. "
                "Fix: install the torch and onnxruntime-training versions listed in lightning_ort's README."
            ) from err
    # ORT looks for its extensions only inside site-packages; ours live in the cache and are registered.
    init_error = package._FALLBACK_INIT_EXCEPTION
    if init_error is not None and "extensions were not detected" in str(init_error):
        package._FALLBACK_INIT_EXCEPTION = None
    elif init_error is not None:
        raise ORTSetupError(f"ORTModule cannot start: {init_error}")
    for hook in _after_import:
        hook()
    return package


def _torch_version() -> str:
    import torch

    return torch.__version__


def is_loaded() -> bool:
    """Whether ORT's training frontend was imported in this process."""
    return ortmodule_package.cache_info().currsize > 0 and _ORTMODULE in sys.modules
