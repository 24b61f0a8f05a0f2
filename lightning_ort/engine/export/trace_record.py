"""What an export's trace taught lightning_ort about a module, kept with a cached export.

An export served from the cache (``export_cache.py``) runs no trace, so what lightning_ort learns
from the trace must come from the cache entry: the module attributes the forward read
(``python_reads.py``: a later change must hand the module to PyTorch) and how often one forward
runs each BatchNorm layer (``batchnorm.py``: ORT's graph cannot advance ``num_batches_tracked``).
Without them a process that reused a cached graph kept computing with an attribute's old value and
left ``num_batches_tracked`` where it was.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from lightning_ort.engine.export.guards import python_reads, size_guards
from lightning_ort.engine.export.user_code import adapter_of, user_modules
from lightning_ort.engine.ops.kernels import batchnorm

FILE = "trace.json"


def save(directory: Path, module: torch.nn.Module) -> None:
    """Write what the export of ``module`` (ORT's flattened module) just traced next to its graph."""
    record = {
        "reads": python_reads.to_record(python_reads.reads_of(adapter_of(module))),
        "batch_norm_calls": batchnorm.recorded_calls(module),
        "size_decisions": size_guards.to_record(adapter_of(module)),
    }
    (directory / FILE).write_text(json.dumps(record))


def restore(directory: Path, module: torch.nn.Module) -> str | None:
    """Take over the record saved with the cached export of ``module``; why it cannot be (the entry
    must then be exported anew), or None."""
    try:
        record: dict[str, Any] = json.loads((directory / FILE).read_text())
        problem = python_reads.from_record(
            python_reads.reads_of(adapter_of(module)), user_modules(module), record["reads"]
        )
        if problem is None:
            problem = size_guards.from_record(adapter_of(module), record["size_decisions"])
        if problem is None:
            batchnorm.restore_calls(module, record["batch_norm_calls"])
        return problem
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"its trace record is missing or unreadable ({error})"
