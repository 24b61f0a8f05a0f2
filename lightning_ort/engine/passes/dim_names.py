"""Symbolic dimension names that ORT's memory inspector can parse.

torch's exporter names an unknown dimension of a node's output after the node, scope included
(``ATen/_original_module/encoder/layers.1/linear1/ATen_output_0_dim_0``). ORT's memory inspector
parses these names as sympy expressions whenever it finds a recompute candidate (a Dropout after a
lightning_ort ATen node, for example) and crashes on the ``/`` and ``.``. Only the names change.
"""

from __future__ import annotations

import re
from typing import Any

import onnx


def _value_infos(graph: Any) -> list[Any]:
    return [*graph.input, *graph.output, *graph.value_info]


def sanitize_dim_names(model: onnx.ModelProto) -> None:
    """Rename every symbolic dimension of ``model``'s graph that is not a Python identifier."""
    used = {
        dim.dim_param
        for value in _value_infos(model.graph)
        for dim in value.type.tensor_type.shape.dim
        if dim.dim_param
    }
    renamed: dict[str, str] = {}
    for value in _value_infos(model.graph):
        for dim in value.type.tensor_type.shape.dim:
            name = dim.dim_param
            if not name or name.isidentifier():
                continue
            if name not in renamed:
                candidate = re.sub(r"\W", "_", name)
                if not candidate.isidentifier():
                    candidate = f"dim_{candidate}"
                base, index = candidate, 0
                while candidate in used:
                    index += 1
                    candidate = f"{base}_{index}"
                used.add(candidate)
                renamed[name] = candidate
            dim.dim_param = renamed[name]
