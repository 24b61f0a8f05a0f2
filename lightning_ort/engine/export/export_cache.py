"""Reuse ORT's ONNX export of a module in later processes (``ORTStrategy(export_cache=True)``).

ORT can load an exported graph from ``ortmodule_cache_dir`` instead of exporting again, but it keys
the file only by the printed module structure: a changed ``forward``, other input types or another
train/eval state would silently reuse a wrong graph. lightning_ort therefore hands ORT a directory
named by a key over everything the export depends on that can be seen from outside:

- torch, ORT, Python and lightning_ort (its sources) versions, the opset, op_rewrites, custom
  autograd.Function support, the autocast state;
- the source files of all user code loaded in the process (every module outside the Python
  installation), so any edit to a ``forward`` or a helper it calls gives a new key; if a module class
  has no source file (defined in a notebook or a REPL), nothing is cached;
- the installed versions of the libraries loaded in the process (transformers, timm, ...), whose code
  is not hashed: an upgrade gives a new key;
- the module tree: structure, train/eval flags, parameter and buffer names, shapes, dtypes and
  ``requires_grad``, plain tensor attributes (by value) and other attributes (by ``repr`` where it
  shows a value);
- the inputs: kinds, dtypes, ranks, ``requires_grad``, and non-tensor values.

What the key cannot see is state a ``forward`` reads from elsewhere (environment variables, globals
set at run time, files, a library edited in place without a new version); such models must not use
the cache, and that is why it is off by default: a wrong graph would train silently. Graphs with
custom autograd.Functions (PythonOp nodes) are never cached, and an export that lightning_ort refuses
is removed from it.
What the export's trace recorded (module attributes read, BatchNorm calls per forward) is kept with
the graph (``trace_record.py``) and taken over when it is reused. A key holds up to
``_ENTRIES_PER_KEY`` graphs, one per set of recorded values; none that fits the module's: a new export.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import inspect
import logging
import os
import shutil
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import torch

from lightning_ort.engine.bootstrap.extensions import cache_root
from lightning_ort.engine.export import trace_record

log = logging.getLogger(__name__)

_LIBRARY_ROOTS = tuple(
    {os.path.realpath(path) + os.sep for path in (sys.prefix, sys.base_prefix, *sysconfig.get_paths().values())}
)
_PACKAGE_DIR = str(Path(__file__).resolve().parents[2]) + os.sep  # lightning_ort/
# ORT's flattened module keeps the output structure of its last export in `_output_schema`: not
# something an export depends on, and keyed it gave a module's first export and its later ones
# (eval after train, a re-export) different keys depending on what ran before in the process.
_MODULE_INTERNALS = {"_parameters", "_buffers", "_modules", "training", "_output_schema"}
_ENTRIES_PER_KEY = 8


class _Uncacheable(Exception):
    """Something the export depends on cannot be keyed."""


def _is_user_file(path: str) -> bool:
    real = os.path.realpath(path)
    return not real.startswith(_LIBRARY_ROOTS) and not real.startswith(_PACKAGE_DIR)


@functools.cache
def _package_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(Path(_PACKAGE_DIR).rglob("*")):
        if path.suffix in (".py", ".cc"):
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _user_sources(digest: Any) -> None:
    files = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and path.endswith(".py") and _is_user_file(path):
            files.add(os.path.realpath(path))
    for path in sorted(files):
        digest.update(path.encode())
        with contextlib.suppress(OSError):
            digest.update(Path(path).read_bytes())


@functools.cache
def _distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


@functools.cache
def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _library_versions(digest: Any) -> None:
    """The installed versions of the libraries loaded in the process (transformers, timm, ...): their
    code is not hashed like the user's, so an upgrade must change the key through the version."""
    distributions = _distributions()
    names = set()
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if "." not in name and path and not _is_user_file(path):
            names.update(distributions.get(name, ()))
    for name in sorted(names):
        digest.update(f"{name}=={_version(name)}".encode())


def _value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        content = hashlib.sha256(value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return f"tensor:{value.dtype}:{tuple(value.shape)}:{content.hexdigest()}"
    text = repr(value)
    # an object's default repr shows only its address; its type is all that can be keyed
    return type(value).__qualname__ if " at 0x" in text else text


def _module_tree(module: torch.nn.Module, digest: Any) -> None:
    digest.update(str(module).encode())
    for name, submodule in module.named_modules():
        for cls in type(submodule).__mro__[:-1]:  # all but `object`
            source = inspect.getsourcefile(cls)
            if source is None or not Path(source).is_file():
                raise _Uncacheable(f"{cls.__qualname__} has no source file")
        digest.update(
            f"{name}:{type(submodule).__module__}.{type(submodule).__qualname__}:{submodule.training}".encode()
        )
        for key, value in sorted(vars(submodule).items()):
            if key not in _MODULE_INTERNALS and not key.startswith("_forward") and not callable(value):
                digest.update(f"{key}={_value(value)}".encode())
    for name, tensor in (*module.named_parameters(), *module.named_buffers()):
        digest.update(
            f"{name}:{tensor.dtype}:{tuple(tensor.shape)}:{tensor.requires_grad}:{tensor.device.type}".encode()
        )


def _inputs(inputs: Any, digest: Any) -> None:
    for value in inputs:
        if isinstance(value, torch.Tensor):
            digest.update(f"tensor:{value.dtype}:{value.dim()}:{value.requires_grad}:{value.device.type}".encode())
        else:
            digest.update(_value(value).encode())


def _autocast_state() -> str:
    states = []
    for device in ("cpu", "cuda"):
        states.append(f"{device}:{torch.is_autocast_enabled(device)}:{torch.get_autocast_dtype(device)}")
    return ",".join(states)


def cache_directory(
    module: torch.nn.Module, inputs: Any, model_info: Any, opset: int, rewrites: bool, custom_functions: bool
) -> Path | None:
    """The directory for this export's cached graph, or None when the export cannot be keyed."""
    import onnxruntime

    digest = hashlib.sha256()
    for part in (torch.__version__, onnxruntime.__version__, sys.version, _package_digest(), opset, rewrites):
        digest.update(str(part).encode())
    digest.update(f"{custom_functions}:{_autocast_state()}:{model_info!r}".encode())
    try:
        _module_tree(module, digest)
    except (_Uncacheable, TypeError, OSError) as reason:
        log.info("lightning_ort: the export of %s is not cached: %s", type(module).__qualname__, reason)
        return None
    _inputs(inputs, digest)
    _user_sources(digest)
    _library_versions(digest)
    directory = cache_root() / "exports" / digest.hexdigest()[:32]
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        log.warning("lightning_ort: export cache directory %s is not writable (%s); exporting anew.", directory, error)
        return None
    return directory


def _remove(entry: Path) -> None:
    """Remove a cache entry, and its key's directory once no entry is left."""
    shutil.rmtree(entry, ignore_errors=True)
    with contextlib.suppress(OSError):
        entry.parent.rmdir()


def _has_python_ops(model: onnx.ModelProto) -> bool:
    return any(node.op_type in ("PythonOp", "PythonOpGrad") for node in model.graph.node)


@contextlib.contextmanager
def export_cache(directory: Path | None, logger: logging.Logger) -> Iterator[list[Any]]:
    """Around ORT's export: report a reused graph, and drop cache entries that must not be reused.

    The block appends ORT's export result to the yielded list.
    """
    if directory is None:
        yield []
        return
    existing = {path.name for path in directory.glob("*.onnx")}
    results: list[Any] = []
    quiet = _CachedModelNote()
    logger.addFilter(quiet)
    try:
        yield results
    except BaseException:
        _remove(directory)  # refused or failed: never reuse it
        raise
    finally:
        logger.removeFilter(quiet)
    if results and _has_python_ops(results[0][0]):
        _remove(directory)
    elif quiet.hit or existing:
        log.info("lightning_ort: reused the cached ONNX export in %s", directory)
    else:
        log.info("lightning_ort: cached the ONNX export in %s", directory)


def cache_entry(directory: Path, module: torch.nn.Module) -> tuple[Path, bool]:
    """Before ORT's export of ``module``: the entry of the key ``directory`` ORT should use, and whether
    it holds a graph ORT will reuse (its trace record then taken over).

    One key holds a graph per set of values the forward read (a temperature that changes during a
    run gives a second graph under the same key), so each entry is tried in turn; none fits: a new one.
    """
    entries = sorted((path for path in directory.iterdir() if path.is_dir()), key=lambda path: path.stat().st_mtime)
    for entry in entries:
        if not any(entry.glob("*.onnx")):
            continue  # being exported by another process (DDP), or never finished: evicted with the oldest
        problem = trace_record.restore(entry, module)
        if problem is None:
            entry.touch()
            return entry, True
        log.info("lightning_ort: the cached ONNX export in %s does not fit: %s", entry, problem)
    for entry in entries[: max(0, len(entries) - _ENTRIES_PER_KEY + 1)]:
        shutil.rmtree(entry, ignore_errors=True)
    number = max((int(entry.name) for entry in entries if entry.name.isdigit()), default=-1) + 1
    fresh = directory / str(number)
    fresh.mkdir(parents=True, exist_ok=True)
    return fresh, False


def keep_trace_record(entry: Path, module: torch.nn.Module) -> None:
    """After a new export of ``module`` that ``entry`` now caches: keep what its trace recorded."""
    if any(entry.glob("*.onnx")):
        trace_record.save(entry, module)


class _CachedModelNote(logging.Filter):
    """Swallows ORT's "Cached model detected! ... DELETE ..." warning (lightning_ort logs its own note)."""

    def __init__(self) -> None:
        super().__init__()
        self.hit = False

    def filter(self, record: logging.LogRecord) -> bool:
        if "Cached model detected" in record.getMessage():
            self.hit = True
            return False
        return True
