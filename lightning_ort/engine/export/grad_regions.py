"""Regions of a traced forward that turn gradients off, and whether ORT's graph would differ there.

The trace keeps no trace of grad mode, so ORT's graph computes gradients through a ``torch.no_grad()``
region. That changes training only where the region computes from something that needs a gradient
(a parameter, an input that requires one): such regions are refused. Hugging Face's rotary embeddings
(``@torch.no_grad()`` on ``LlamaRotaryEmbedding.forward`` since transformers 4.38, also Mistral, Qwen2,
Gemma) compute from a buffer and the position ids only; their graph is the same either way, and the
whole model fell back to PyTorch for them. Their position ids are often ``arange(embeddings.shape[1])``:
a size read carries no gradient, so the embedding behind it does not count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils import _pytree

from lightning_ort.engine.export.value_traces import value_trace


class GradRegions:
    """The no-grad regions open while the export traces (:meth:`enter` / :meth:`leave`), and those whose
    calls take a tensor computed from something that needs a gradient (:attr:`unsafe`)."""

    def __init__(
        self,
        module: torch.nn.Module,
        inputs: list[tuple[torch.Tensor, int]],
        graph_inputs_of: Callable[..., Iterator[torch._C.Value]],
    ) -> None:
        # graph_inputs_of is traced_calls.graph_inputs_of, handed in by the export guard: traced_calls
        # imports this module, so importing it back would make an import cycle.
        self._graph_inputs_of = graph_inputs_of
        self._module = module
        self._inputs = inputs  # the copies of forward's inputs the export runs on
        self._open: list[str | None] = []  # None: a region torch's own code opened
        self._without_gradient: set[int] | None = None
        self.unsafe: list[str] = []
        # where gradients were turned off other than by a no_grad region (set_grad_enabled(False), inference_mode)
        self.switched: list[str] = []

    def enter(self, location: str | None) -> None:
        self._open.append(location)

    def leave(self) -> None:
        if self._open:
            self._open.pop()

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Called for every torch call the trace records: note the open region if the call takes a tensor
        the graph computes from a parameter or input that requires a gradient."""
        location = next((location for location in reversed(self._open) if location is not None), None)
        if location is None or location in self.unsafe:
            return
        tensors = [leaf for leaf in _pytree.tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
        if any(self._needs_gradient(tensor) for tensor in tensors):
            self.unsafe.append(location)

    def _needs_gradient(self, tensor: torch.Tensor) -> bool:
        value = value_trace(tensor)
        if value is None:
            return tensor.requires_grad
        safe = self._graph_inputs_without_gradient()
        return any(
            graph_input.unique() not in safe for graph_input in self._graph_inputs_of(value, through_sizes=False)
        )

    def _graph_inputs_without_gradient(self) -> set[int]:
        if self._without_gradient is None:
            tensors: Iterable[torch.Tensor] = [
                *self._module.buffers(),
                *(parameter for parameter in self._module.parameters() if not parameter.requires_grad),
                *(tensor for tensor, _ in self._inputs if not tensor.requires_grad),
            ]
            values = (value_trace(tensor) for tensor in tensors)
            self._without_gradient = {value.unique() for value in values if value is not None}
        return self._without_gradient
