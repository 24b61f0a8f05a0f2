"""Validation of ORT's memory optimizer settings (activation recompute)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from lightning.pytorch.utilities.rank_zero import rank_zero_warn

MEMORY_LEVELS = (0, 1, 2)
# A recompute plan of ORT 1.19: "<subgraph>:<optimization type>:<count>", e.g. "BiasGelu+:1:-1".
_PLAN = re.compile(r"^[^:,]+:\d+:-?\d+$")


def validate_memory_options(level: int, config: str | None) -> str | None:
    """Check ``memory_optimization_level`` and ``memory_optimizer_config``; the config's absolute path.

    Levels follow ORT 1.19.2's ``_MemoryOptimizationLevel``: 0 applies only the user's recompute
    plans from ``config``; 1 recomputes transformer layers; 2 also recomputes the "compromised"
    subgraphs (ones that cost more compute to save memory).
    """
    if isinstance(level, bool) or not isinstance(level, int) or level not in MEMORY_LEVELS:
        raise ValueError(
            f"ORTStrategy(memory_optimization_level={level!r}) must be 0 (user plans from "
            "memory_optimizer_config), 1 (transformer layer-wise recompute) or 2 (1 plus compromised subgraphs)."
        )
    if config is None:
        return None
    path = Path(config).expanduser()
    if not path.is_file():
        raise ValueError(f"ORTStrategy(memory_optimizer_config={config!r}): no such file.")
    try:
        plans = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"ORTStrategy(memory_optimizer_config={config!r}) is not valid JSON: {error}.") from error
    if not isinstance(plans, list) or not all(isinstance(plan, str) for plan in plans):
        raise ValueError(
            f"ORTStrategy(memory_optimizer_config={config!r}) must hold a JSON list of plan strings, "
            'e.g. ["BiasGelu+:1:-1"].'
        )
    bad = [part for plan in plans for part in plan.split(",") if not _PLAN.match(part)]
    if bad:
        raise ValueError(
            f"ORTStrategy(memory_optimizer_config={config!r}): {bad[0]!r} is not a recompute plan of the "
            "form '<subgraph>:<type>:<count>', e.g. 'BiasGelu+:1:-1'."
        )
    if level != 0:
        rank_zero_warn(
            f"lightning_ort: memory_optimizer_config is ignored at memory_optimization_level={level}; ORT applies "
            "its own layer-wise plans. Use level 0 to apply the file's plans."
        )
    return str(path.resolve())
