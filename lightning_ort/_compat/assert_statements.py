"""Which source lines hold the condition of an ``assert`` statement.

nanoGPT checks ``assert t <= self.config.block_size`` in forward. Under the export ``t`` is a tensor,
and the check converts it to a Python boolean with a TracerWarning, which the export guard otherwise
refuses (the branch taken would be frozen). An assertion has no branch to freeze: when it holds, the
graph is the same as without it. It is not checked again on later batches (ORT's graph holds no
assert), which the FAQ says.
"""

from __future__ import annotations

import ast
import functools
import linecache


def in_assert_condition(filename: str, lineno: int) -> bool:
    """Whether line ``lineno`` of ``filename`` lies in the condition of an ``assert`` statement."""
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
        if isinstance(node, ast.Assert)
    )
