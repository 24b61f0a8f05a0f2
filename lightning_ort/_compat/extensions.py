"""ORT's PyTorch C++ extensions, built once into a cache directory instead of site-packages.

ORTModule imports its extensions as ``onnxruntime.training.ortmodule.torch_cpp_extensions.<name>``.
We compile the sources ORT ships against the installed torch, keep the shared object in
``$LIGHTNING_ORT_CACHE`` (default ``~/.cache/lightning_ort``), and register the loaded module under
the name ORT imports.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import sysconfig
import types
from pathlib import Path

import torch

from lightning_ort.errors import ORTSetupError

EXTENSIONS_PACKAGE = "onnxruntime.training.ortmodule.torch_cpp_extensions"
CACHE_ENV = "LIGHTNING_ORT_CACHE"


def cache_root() -> Path:
    """Directory that holds lightning_ort's build products (``$LIGHTNING_ORT_CACHE`` or ``~/.cache/lightning_ort``)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "lightning_ort"


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def _aten_op_executor_source() -> Path:
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or spec.origin is None:
        raise ORTSetupError("onnxruntime is not installed. Fix: pip install 'lightning-ort[cpu]'.")
    source = (
        Path(spec.origin).parent / "training/ortmodule/torch_cpp_extensions/cpu/aten_op_executor/aten_op_executor.cc"
    )
    if not source.is_file():
        raise ORTSetupError(
            f"ORT's aten_op_executor source was not found at {source}. The installed onnxruntime is not a "
            "training build. Fix: pip uninstall onnxruntime && pip install 'lightning-ort[cpu]'."
        )
    return source


def _build_dir(name: str, source: Path) -> Path:
    key = hashlib.sha256()
    key.update(source.read_bytes())
    for part in (torch.__version__, _ort_version(), sys.version, sysconfig.get_platform()):
        key.update(part.encode())
    return cache_root() / "extensions" / f"{name}-{key.hexdigest()[:16]}"


def _check_toolchain() -> None:
    from torch.utils.cpp_extension import is_ninja_available

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise ORTSetupError(
            f"No C++ compiler found (looked for {compiler!r}). lightning_ort compiles ORT's PyTorch extension "
            "once per torch version. Fix: install g++ (e.g. `apt-get install g++`) or set CXX, then run "
            "`python -m lightning_ort setup`."
        )
    if not is_ninja_available():
        raise ORTSetupError(
            "ninja was not found. lightning_ort compiles ORT's PyTorch extension with it. "
            "Fix: pip install ninja, then run `python -m lightning_ort setup`."
        )


def _load_shared_object(name: str, path: Path) -> types.ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def build_aten_op_executor(verbose: bool = False) -> tuple[Path, bool]:
    """Return the path of the compiled ``aten_op_executor`` and whether it was built just now."""
    source = _aten_op_executor_source()
    build_dir = _build_dir("aten_op_executor", source)
    shared_object = build_dir / "aten_op_executor.so"
    if shared_object.is_file():
        return shared_object, False
    _check_toolchain()
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ORTSetupError(
            f"Cannot create the extension cache directory {build_dir}: {err}. "
            f"Fix: point {CACHE_ENV} at a writable directory."
        ) from err
    print(f"lightning_ort: building ORT's aten_op_executor extension into {build_dir} (once)...", file=sys.stderr)
    from torch.utils.cpp_extension import load

    try:
        load(
            name="aten_op_executor",
            sources=[str(source)],
            build_directory=str(build_dir),
            verbose=verbose,
            is_python_module=False,
        )
    except Exception as err:
        raise ORTSetupError(
            f"Building ORT's aten_op_executor extension in {build_dir} failed: {err}. "
            "Fix: check that g++ and ninja work and that torch's headers are installed; "
            "build output: `python -m lightning_ort setup --verbose`."
        ) from err
    if not shared_object.is_file():
        raise ORTSetupError(f"The extension build finished but {shared_object} is missing.")
    return shared_object, True


def _interop_stand_in() -> types.ModuleType:
    """Module standing in for ``torch_interop_utils``, which does not compile against torch >= 2.5.

    ORT imports it even with custom autograd.Function support off; only ``clear_all_grad_fns`` is
    called then (at exit). Anything else means custom-function support was turned on, which
    lightning_ort does not do yet.
    """
    module = types.ModuleType(f"{EXTENSIONS_PACKAGE}.torch_interop_utils")

    def clear_all_grad_fns() -> None:
        return None

    def __getattr__(name: str) -> object:
        raise AttributeError(
            f"torch_interop_utils.{name} is unavailable: custom torch.autograd.Function support inside ORT "
            "graphs is not built by lightning_ort yet."
        )

    module.clear_all_grad_fns = clear_all_grad_fns  # type: ignore[attr-defined]
    module.__getattr__ = __getattr__  # type: ignore[attr-defined]
    return module


def register_extensions() -> None:
    """Build (or reuse) the extensions and register them under the names ORTModule imports."""
    package = importlib.import_module(EXTENSIONS_PACKAGE)
    if f"{EXTENSIONS_PACKAGE}.aten_op_executor" not in sys.modules:
        shared_object, _ = build_aten_op_executor()
        aten = _load_shared_object("aten_op_executor", shared_object)
        sys.modules[f"{EXTENSIONS_PACKAGE}.aten_op_executor"] = aten
        package.aten_op_executor = aten  # type: ignore[attr-defined]
    if f"{EXTENSIONS_PACKAGE}.torch_interop_utils" not in sys.modules:
        stand_in = _interop_stand_in()
        sys.modules[stand_in.__name__] = stand_in
        package.torch_interop_utils = stand_in  # type: ignore[attr-defined]
