"""ORT's PyTorch C++ extensions, built once into a cache directory instead of site-packages.

ORTModule imports its extensions as ``onnxruntime.training.ortmodule.torch_cpp_extensions.<name>``.
We compile ``aten_op_executor`` from the source ORT ships, lightning_ort's own operators that ORT
graphs run through it (``csrc/torch_kernels.cc``, with their memory arena) and, in place of ORT's
``torch_interop_utils`` (which no longer compiles), lightning_ort's own runner for custom
autograd.Functions (``csrc/custom_function_runner.cc``), against the installed torch; the shared
objects live in ``$LIGHTNING_ORT_CACHE`` (default ``~/.cache/lightning_ort``), and the modules are
registered under the names ORT imports.

Over 300 lines because the three extensions share one build (cache key, lock, compiler check, the
announcement of a first build) and one registration under ORT's names; each has only a few lines of its own.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib.machinery
import importlib.util
import os
import re
import shutil
import sys
import sysconfig
import types
from collections.abc import Callable
from pathlib import Path

import torch

from lightning_ort.errors import ORTSetupError

EXTENSIONS_PACKAGE = "onnxruntime.training.ortmodule.torch_cpp_extensions"
# lightning_ort's C++ sources (package data), shared by the engine's layers: lightning_ort/engine/csrc.
_CSRC = Path(__file__).parent.parent / "csrc"
CACHE_ENV = "LIGHTNING_ORT_CACHE"
# torch's JIT builds pass no optimization level, so g++ compiled at -O0: the glue around every ATen
# node of an ORT graph (executor, arena, operators) ran unoptimized. -O2 keeps IEEE semantics.
_CXX_FLAGS = ["-O2"]


def cache_root() -> Path:
    """Directory that holds lightning_ort's build products (``$LIGHTNING_ORT_CACHE`` or ``~/.cache/lightning_ort``)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "lightning_ort"


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


# ORT's executor hands an operator's contiguous output to ORT as it is, also when it shares memory
# with an input (a view, or the input itself: `unbind` parts split off a size-1 batch, ORT's own
# `diagonal` export of a (B, 1, 1) tensor). ORT does not know, and reuses the input's memory after
# the node, so the output changed under the next nodes: silently wrong training. Such outputs are
# copied.
_OUTPUT_AS_IS = "at::toDLPack(tensor.is_contiguous() ? tensor : tensor.contiguous())"
_OUTPUT_OWNED = "at::toDLPack(lightning_ort_owned_output(tensor, arguments))"
_EXECUTOR = "void ExecuteATenOperator("
_OWNED_OUTPUT_FUNCTION = """// lightning_ort: an output sharing memory with an input is copied (extensions.py says why).
at::Tensor lightning_ort_owned_output(const at::Tensor& tensor, const std::vector<c10::IValue>& arguments) {
  for (const auto& argument : arguments) {
    if (argument.isTensor() && argument.toTensor().defined() && tensor.is_alias_of(argument.toTensor())) {
      return tensor.clone(at::MemoryFormat::Contiguous);
    }
  }
  return tensor.is_contiguous() ? tensor : tensor.contiguous();
}

"""


# ORT's executor includes all of libtorch's C++ frontend (torch/torch.h: nn modules, optimizers, data
# loaders) to use the JIT's operator registry; the headers it needs compile in about half the time.
_ALL_OF_TORCH = "#include <torch/torch.h>"
_WHAT_THE_EXECUTOR_USES = (
    "#include <pybind11/pybind11.h>\n#include <torch/csrc/jit/runtime/operator.h>\n#include <torch/version.h>"
)


def _owned_outputs(source: Path) -> str:
    """ORT's executor source with outputs that share an input's memory copied (compiled from the
    build directory; site-packages stays untouched), including only the headers it uses."""
    text = source.read_text()
    if text.count(_OUTPUT_AS_IS) != 1 or text.count(_EXECUTOR) != 1 or text.count(_ALL_OF_TORCH) != 1:
        raise ORTSetupError(
            f"ORT's aten_op_executor source at {source} is not the one lightning_ort was written for "
            "(onnxruntime-training 1.19.2). Fix: pip install 'lightning-ort[cpu]' to get that version."
        )
    text = text.replace(_ALL_OF_TORCH, _WHAT_THE_EXECUTOR_USES)
    return text.replace(_OUTPUT_AS_IS, _OUTPUT_OWNED).replace(_EXECUTOR, _OWNED_OUTPUT_FUNCTION + _EXECUTOR)


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


def _build_dir(name: str, files: list[Path], generated: dict[str, str]) -> Path:
    key = hashlib.sha256()
    for file in files:
        key.update(file.read_bytes())
    for file_name, text in sorted(generated.items()):
        key.update(f"{file_name}:{text}".encode())
    for part in (torch.__version__, _ort_version(), sys.version, sysconfig.get_platform(), *_CXX_FLAGS):
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


# Compiler seconds (user + sys) each extension took on a 2-core VM, for the notice printed while they build.
_COMPILE_SECONDS = {"aten_op_executor": 13, "lightning_ort_aten_ops": 22, "lightning_ort_custom_function_runner": 15}


def _announce(builds: list[tuple[str, str]], directory: Path) -> None:
    """One line on stderr before ``builds`` (name, what) compile: what, roughly how long, where."""
    parts = [_COMPILE_SECONDS.get(name, 30) for name, _ in builds]
    seconds = max(*parts, sum(parts) // min(len(parts), os.cpu_count() or 1))  # built side by side
    what = " and ".join(what for _, what in builds)
    print(
        f"lightning_ort: compiling {what} for torch {torch.__version__} (first use only: about {seconds} s on an "
        f"idle machine, longer on a busy one; kept in {directory})...",
        file=sys.stderr,
        flush=True,
    )


def _build(
    name: str,
    source: Path | list[Path],
    what: str,
    verbose: bool,
    headers: list[Path] | None = None,
    generated: dict[str, str] | None = None,
    include_dirs: list[Path] | None = None,
    announce: bool = True,
) -> tuple[Path, bool]:
    """Compile ``source`` (one file or several, which may include ``headers``) and ``generated``
    sources (file name -> text, written into the build directory) into
    ``<cache>/extensions/<name>-<key>/<name>.so`` unless it is there already."""
    sources = list(source) if isinstance(source, list) else [source]
    generated = generated or {}
    build_dir = _build_dir(name, sources + (headers or []), generated)
    shared_object = build_dir / f"{name}.so"
    if shared_object.is_file():
        return shared_object, False
    _check_toolchain()
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
        for file_name, text in generated.items():
            (build_dir / file_name).write_text(text)
            sources.append(build_dir / file_name)
    except OSError as err:
        raise ORTSetupError(
            f"Cannot create the extension cache directory {build_dir}: {err}. "
            f"Fix: point {CACHE_ENV} at a writable directory."
        ) from err
    if announce:
        _announce([(name, what)], build_dir.parent)
    from torch.utils.cpp_extension import load

    try:
        load(
            name=name,
            sources=[str(path) for path in sources],
            build_directory=str(build_dir),
            extra_cflags=_CXX_FLAGS,
            extra_include_paths=[str(path) for path in include_dirs or []],
            verbose=verbose,
            is_python_module=False,
        )
    except Exception as err:
        raise ORTSetupError(
            f"Building {what} in {build_dir} failed: {err}. "
            "Fix: check that g++ and ninja work and that torch's headers are installed; "
            "build output: `python -m lightning_ort setup --verbose`."
        ) from err
    if not shared_object.is_file():
        raise ORTSetupError(f"The extension build finished but {shared_object} is missing.")
    return shared_object, True


def _is_built(name: str, files: list[Path], generated: dict[str, str] | None = None) -> bool:
    return (_build_dir(name, files, generated or {}) / f"{name}.so").is_file()


def check_can_build() -> None:
    """Raise :class:`ORTSetupError` unless an extension could be compiled now (a compiler, ninja and a
    writable cache): the cheap part of a build's checks, for deciding before building."""
    _check_toolchain()
    directory = cache_root() / "extensions"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ORTSetupError(
            f"Cannot create the extension cache directory {directory}: {err}. "
            f"Fix: point {CACHE_ENV} at a writable directory."
        ) from err


ATEN_OP_EXECUTOR = "aten_op_executor"
_EXECUTOR_WHAT = "ORT's aten_op_executor"


def _executor_generated() -> dict[str, str]:
    return {"aten_op_executor.cc": _owned_outputs(_aten_op_executor_source())}


def build_aten_op_executor(verbose: bool = False, announce: bool = True) -> tuple[Path, bool]:
    """Return the path of the compiled ``aten_op_executor`` and whether it was built just now."""
    return _build(ATEN_OP_EXECUTOR, [], _EXECUTOR_WHAT, verbose, generated=_executor_generated(), announce=announce)


def _packaged(source: Path) -> Path:
    """``source`` (a C++ file shipped as package data), or the error naming the broken install."""
    if not source.is_file():
        raise ORTSetupError(
            f"lightning_ort's C++ source {source} is missing: the package was installed without its data files. "
            "Fix: reinstall lightning-ort."
        )
    return source


CUSTOM_FUNCTION_RUNNER = "lightning_ort_custom_function_runner"


def custom_function_runner_source() -> Path:
    """lightning_ort's own C++ source of the runners for custom autograd.Functions (package data)."""
    return _CSRC / "custom_function_runner.cc"


def build_custom_function_runner(verbose: bool = False) -> tuple[Path, bool]:
    """Return the path of lightning_ort's compiled custom-Function runner and whether it was built just now.

    It replaces ORT's ``torch_interop_utils``, which does not compile against torch >= 2.5.
    """
    source = _packaged(custom_function_runner_source())
    return _build(CUSTOM_FUNCTION_RUNNER, source, "the custom autograd.Function runner", verbose)


def custom_function_runner_built() -> bool:
    """Whether the custom-Function runner is in the cache already (loading it then compiles nothing)."""
    return _is_built(CUSTOM_FUNCTION_RUNNER, [_packaged(custom_function_runner_source())])


def load_custom_function_runner() -> types.ModuleType:
    """Build (or reuse) and import the custom-Function runner extension."""
    existing = sys.modules.get(CUSTOM_FUNCTION_RUNNER)
    if existing is not None:
        return existing
    shared_object, _ = build_custom_function_runner()
    try:
        module = _load_shared_object(CUSTOM_FUNCTION_RUNNER, shared_object)
    except ImportError as err:
        raise ORTSetupError(
            f"The custom autograd.Function runner {shared_object} does not load: {err}. "
            f"Fix: delete {shared_object.parent} so that it is rebuilt."
        ) from err
    sys.modules[CUSTOM_FUNCTION_RUNNER] = module
    return module


ATEN_OPS = "lightning_ort_aten_ops"
_aten_ops_path: Path | None = None


def aten_ops_sources() -> list[Path]:
    """lightning_ort's C++ sources of the ``lightning_ort::*`` operators ORT graphs run and of their
    memory arena (package data)."""
    names = (
        "torch_kernels.cc",
        "channels_last.cc",
        "memory_arena.cc",
        "unbind.cc",
        "upsample.cc",
        "activations.cc",
        "math_ops.cc",
        "special_functions.cc",
        "indexing.cc",
        "layers.cc",
        "pooling.cc",
        "reductions.cc",
        "rnn.cc",
        "einsum.cc",
        "distances.cc",
        "sampling.cc",
    )
    return [_CSRC / name for name in names]


def _aten_ops_headers() -> list[Path]:
    return [_CSRC / name for name in ("overloads.h", "scales.h", "autograd_vjp.h")]


_OPS_WHAT = "lightning_ort's operators"
_DEFINE = re.compile(r"^\s*#\s*define\s+(\w+)", re.MULTILINE)


def _aten_ops_unity(sources: list[Path]) -> dict[str, str]:
    """One translation unit that includes every operator file: torch's headers, most of each file's
    compile time, are parsed once instead of once a file. Each file's macros are undefined after it,
    as if it were compiled alone; no file defines or calls unqualified a function another file defines
    (tests/test_extension_cache.py checks it), so overload resolution is what it is file by file."""
    lines = [
        "// Generated by lightning_ort/engine/bootstrap/extensions.py: all operator files in one translation unit."
    ]
    for source in sources:
        lines.append(f'#include "{source.name}"')
        lines.extend(f"#undef {macro}" for macro in dict.fromkeys(_DEFINE.findall(source.read_text())))
    return {f"{ATEN_OPS}.cc": "\n".join(lines) + "\n"}


def _aten_ops_inputs() -> tuple[list[Path], dict[str, str]]:
    """The files the operators' build depends on, and the generated source that is compiled."""
    sources = [_packaged(source) for source in aten_ops_sources()]
    headers = [_packaged(header) for header in _aten_ops_headers()]
    return sources + headers, _aten_ops_unity(sources)


def build_aten_ops(verbose: bool = False, announce: bool = True) -> tuple[Path, bool]:
    """Return the path of the compiled ``lightning_ort::*`` operators and whether they were built just now."""
    files, unity = _aten_ops_inputs()
    include_dirs = [_CSRC]
    return _build(ATEN_OPS, [], _OPS_WHAT, verbose, files, unity, include_dirs, announce)


def load_aten_ops(verbose: bool = False) -> Path:
    """Build (or reuse) and load the ``lightning_ort::*`` operators; return the library's path."""
    global _aten_ops_path
    if _aten_ops_path is not None:  # a process loads them once (torch cannot unload operators)
        return _aten_ops_path
    shared_object, _ = build_aten_ops(verbose)
    if str(shared_object) not in torch.ops.loaded_libraries:
        try:
            torch.ops.load_library(str(shared_object))
        except OSError as err:
            raise ORTSetupError(
                f"lightning_ort's operators {shared_object} do not load: {err}. "
                f"Fix: delete {shared_object.parent} so that it is rebuilt."
            ) from err
    _aten_ops_path = shared_object
    return shared_object


def build_missing(verbose: bool = False) -> list[str]:
    """Build the extensions every ORT graph needs (ORT's executor and lightning_ort's operators) that
    the cache lacks, side by side, after one notice saying what and roughly how long; return their names."""
    missing = []
    if not _is_built(ATEN_OP_EXECUTOR, [], _executor_generated()):
        missing.append((ATEN_OP_EXECUTOR, _EXECUTOR_WHAT, build_aten_op_executor))
    if _aten_ops_path is None and not _is_built(ATEN_OPS, *_aten_ops_inputs()):
        missing.append((ATEN_OPS, _OPS_WHAT, build_aten_ops))
    if not missing:
        return []
    check_can_build()
    _announce([(name, what) for name, what, _ in missing], cache_root() / "extensions")
    if len(missing) == 1:
        missing[0][2](verbose, announce=False)
    else:
        # Each build is one compiler process; torch's loader waits on it with the GIL released.
        with concurrent.futures.ThreadPoolExecutor(len(missing)) as pool:
            builds = [pool.submit(build, verbose, announce=False) for _, _, build in missing]
            for build in builds:
                build.result()
    return [name for name, _, _ in missing]


# Builds the module ORT imports as torch_interop_utils (custom_function.interop_module). custom_function builds
# its runner with this module, so it is handed in (by lightning_ort's engine package) instead of imported here.
_interop_module: Callable[[str], types.ModuleType] | None = None


def provide_interop_module(factory: Callable[[str], types.ModuleType]) -> None:
    """Set what :func:`register_extensions` registers as ORT's ``torch_interop_utils``: ``factory(name)``."""
    global _interop_module
    _interop_module = factory


def register_extensions() -> None:
    """Build (or reuse) the extensions and register them under the names ORTModule imports."""
    package = importlib.import_module(EXTENSIONS_PACKAGE)
    build_missing()
    if f"{EXTENSIONS_PACKAGE}.aten_op_executor" not in sys.modules:
        shared_object, _ = build_aten_op_executor()
        aten = _load_shared_object("aten_op_executor", shared_object)
        sys.modules[f"{EXTENSIONS_PACKAGE}.aten_op_executor"] = aten
        package.aten_op_executor = aten  # type: ignore[attr-defined]
    load_aten_ops()
    if f"{EXTENSIONS_PACKAGE}.torch_interop_utils" not in sys.modules:
        # ORT imports torch_interop_utils even with custom-Function support off; ours compiles its C++
        # part only when a graph runs a custom Function (see custom_function.py).
        if _interop_module is None:
            raise ORTSetupError("lightning_ort's torch_interop_utils replacement was not provided")
        interop = _interop_module(f"{EXTENSIONS_PACKAGE}.torch_interop_utils")
        sys.modules[interop.__name__] = interop
        package.torch_interop_utils = interop  # type: ignore[attr-defined]
