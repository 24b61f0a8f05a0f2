"""A short, human-readable account of one ONNX graph: size, main ops, ATen fallbacks, fused kernels."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from lightning_ort import engine

ATEN_DOMAIN = "org.pytorch.aten"
# Kernels that ORT's graph optimizers create by fusing several ops (on CPU and CUDA).
_FUSED_OPS = frozenset(
    {
        "Attention",
        "BiasDropout",
        "BiasGelu",
        "BiasSoftmax",
        "BiasSoftmaxDropout",
        "BitmaskBiasDropout",
        "EmbedLayerNormalization",
        "FastGelu",
        "GemmFastGelu",
        "Gelu",
        "LayerNormalization",
        "MatMulScaleSoftmax",
        "MultiHeadAttention",
        "QuickGelu",
        "SimplifiedLayerNormalization",
        "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization",
    }
)


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph``, including those of subgraphs (If/Loop/Scan bodies)."""
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for subgraph in attribute.graphs:
                    yield from _nodes(subgraph)


def _is_fused(node: onnx.NodeProto) -> bool:
    if node.domain == "com.microsoft.nchwc":
        return True
    return node.domain == "com.microsoft" and (node.op_type.startswith("Fused") or node.op_type in _FUSED_OPS)


@dataclass
class GraphSummary:
    """Counts for one saved graph.

    Attributes:
        path: the ``.onnx`` file.
        nodes: number of nodes, subgraphs included.
        op_types: nodes per op type (``op`` for ONNX ops, ``domain.op`` for others).
        aten_ops: ``org.pytorch.aten::ATen`` nodes per torch operator: what ORT runs through torch.
        fused_ops: nodes per fused kernel that ORT's optimizers created.
    """

    path: Path
    nodes: int
    op_types: Counter[str] = field(default_factory=Counter)
    aten_ops: Counter[str] = field(default_factory=Counter)
    fused_ops: Counter[str] = field(default_factory=Counter)

    @classmethod
    def of(cls, path: Path) -> GraphSummary:
        """Read and summarize the ONNX file at ``path``."""
        model = onnx.load(str(path), load_external_data=False)
        summary = cls(path, 0)
        for node in _nodes(model.graph):
            summary.nodes += 1
            op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
            summary.op_types[op] += 1
            if node.domain == ATEN_DOMAIN and node.op_type == "ATen":
                summary.aten_ops[engine.aten_operator(node) or "?"] += 1
            if _is_fused(node):
                summary.fused_ops[op] += 1
        return summary

    def lines(self, top: int = 6) -> list[str]:
        """The summary as indented text lines."""
        return [
            f"  {self.path.name}: {self.nodes} nodes",
            f"    top ops: {_counts(self.op_types, top)}",
            f"    ATen fallback (run by torch inside ORT): {_counts(self.aten_ops)}",
            f"    fused by ORT: {_counts(self.fused_ops)}",
        ]


def _counts(counter: Counter[str], top: int | None = None) -> str:
    items = counter.most_common(top)
    if not items:
        return "none"
    text = ", ".join(f"{name} x{count}" for name, count in items)
    hidden = len(counter) - len(items)
    return f"{text}, ... ({hidden} more)" if hidden > 0 else text
