"""Which source lines hold the condition of an ``assert`` statement, or of an ``if`` that only raises.

nanoGPT checks ``assert t <= self.config.block_size`` in forward. Under the export ``t`` is a tensor,
and the check converts it to a Python boolean with a TracerWarning, which the export guard otherwise
refuses (the branch taken would be frozen). An assertion has no branch to freeze: when it holds, the
graph is the same as without it. Hugging Face's attention classes (transformers <= 4.37: Llama,
Mistral, BART, Whisper, CLIP) check ``if attn_weights.size() != (bsz, heads, q, k): raise
ValueError(...)``, the same check written out. Neither is checked again on later batches (ORT's graph
holds no assertion), which the FAQ says.
"""

from __future__ import annotations

import ast
import functools
import linecache


def in_assert_condition(filename: str, lineno: int) -> bool:
    """Whether line ``lineno`` of ``filename`` lies in the condition of an ``assert`` statement, or of an
    ``if`` statement whose body only raises (no ``else``)."""
    return any(first <= lineno <= last for first, last in _assert_conditions(filename))


@functools.lru_cache(maxsize=256)
def _assert_conditions(filename: str) -> tuple[tuple[int, int], ...]:
    source = "".join(linecache.getlines(filename))
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ()
    return tuple(
        (node.test.lineno, node.test.end_lineno or node.test.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assert) or (isinstance(node, ast.If) and _only_raises(node))
    )


def _only_raises(node: ast.If) -> bool:
    return not node.orelse and all(isinstance(statement, ast.Raise) for statement in node.body)
