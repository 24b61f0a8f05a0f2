"""Export forms for the ops that ORT 1.19.2's CPU kernels run slowly (``ORTStrategy(op_rewrites=...)``).

Profiling ORT's training sessions on the reference workloads (``benchmarks/NOTES.md``) put most of
ORT's deficit against eager PyTorch in a few kernels: GEMMs (MLAS, 1.2-1.4x slower than torch's
MKL), ``Conv``/``ConvGrad``, ``GeluGrad``, ``ReluGrad``, decomposed attention and the
``GatherGrad`` scatter. With the rewrites (the default on CPU), the exporter emits, only for ORT's
own export:

- convolutions, linear layers, GELU, ReLU, LayerNorm and attention without dropout as ATen nodes
  that run torch's kernels (torch_kernels.py), with identical results to eager;
- the ``matmul``, ``masked_fill`` and ``softmax`` of attention written out by hand, likewise
  (matmul_softmax.py);
- ``select`` with a constant index (``x[:, 0]``, the q/k/v split inside ``nn.MultiheadAttention``) as
  ``Slice`` + ``Squeeze``, whose gradient is a ``SliceGrad`` copy instead of the ``GatherGrad``
  scatter that ``Gather`` gets.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.onnx._internal.torchscript_exporter import symbolic_helper

from lightning_ort.engine.ops.kernels import matmul_softmax, torch_kernels


def _select(g: Any, self: Any, dim: Any, index: Any) -> Any:
    from torch.onnx._internal.torchscript_exporter import symbolic_opset11

    dim_value = symbolic_helper._maybe_get_const(dim, "i")
    index_value = symbolic_helper._maybe_get_const(index, "i")
    if symbolic_helper._is_value(index_value) or symbolic_helper._is_value(dim_value):
        return symbolic_opset11.select(g, self, dim, index)
    end = torch.iinfo(torch.int64).max if index_value == -1 else index_value + 1
    sliced = symbolic_helper._slice_helper(g, self, axes=[dim_value], starts=[index_value], ends=[end])
    return symbolic_helper._squeeze_helper(g, sliced, [dim_value])


SYMBOLICS = {**torch_kernels.SYMBOLICS, **matmul_softmax.SYMBOLICS, "select": _select}


def register_gradients() -> None:
    """Give ORT's gradient builder the gradients of the rewritten operators (process-wide)."""
    torch_kernels.register_gradients()
    matmul_softmax.register_gradients()


@contextlib.contextmanager
def rewritten_symbolics(enabled: bool, opset: int) -> Iterator[None]:
    """Within the block, torch's exporter emits the forms above (when ``enabled``).

    The rules they replace for the block (torch's, or ORT's own for ``_convolution``) are put back
    afterwards, so other exports in the process are unaffected.
    """
    if not enabled:
        yield
        return
    from torch.onnx._internal.torchscript_exporter import registration

    replaced: list[tuple[Any, Any]] = []
    for name, function in SYMBOLICS.items():
        qualified = f"aten::{name}"
        group = registration.registry.get_function_group(qualified)
        previous = None if group is None else group._functions._overrides.get(opset)
        registration.registry.register(qualified, opset, function, custom=True)
        replaced.append((registration.registry.get_function_group(qualified), previous))
    try:
        yield
    finally:
        for group, previous in replaced:
            group.remove_custom(opset)
            if previous is not None:
                group.add_custom(previous, opset)
