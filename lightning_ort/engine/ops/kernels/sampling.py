"""Spatial transformers and patch folding on torch's kernels inside ORT's graph.

torch 2.13 cannot export ``F.affine_grid`` (``aten::affine_grid_generator``, ONNX opset 20) nor
``F.fold`` (``aten::col2im``, opset 18) at ORT's opset 17, and ORT 1.19.2 has no gradient for the
``GridSample`` that ``F.grid_sample`` exports to, so spatial transformer networks, deformable
sampling and overlapping-patch models fell back to PyTorch. They are exported as ATen nodes running
torch's operators with eager's gradients: ``affine_grid_generator_backward``, ``im2col`` (the
adjoint of ``col2im``) and, for the two inputs of ``grid_sample``, eager autograd itself
(``csrc/sampling.cc``).
"""

from __future__ import annotations

from typing import Any

from torch.onnx._internal.torchscript_exporter import symbolic_helper

from lightning_ort.engine.ops.kernels.gradient_overloads import register_gradient, register_simple_gradient
from lightning_ort.engine.ops.kernels.torch_kernels import ATEN

_GRID_SAMPLE = "lightning_ort::grid_sample"


def sampled_shape(shapes: list[Any], flags: list[Any]) -> list[Any] | None:
    """``grid_sample``'s output: the input's batch and channels at the grid's points."""
    input, grid = shapes[0], shapes[1]
    return None if input is None or grid is None else [input[0], input[1], *grid[1:-1]]


def folded_shape(shapes: list[Any], flags: list[Any]) -> list[Any] | None:
    """``col2im``'s output, (N, C * kernel, L) -> (N, C, H, W)."""
    return None if shapes[0] is None else [shapes[0][0], None, None, None]


def grid_shape(shapes: list[Any], flags: list[Any]) -> list[Any] | None:
    """``affine_grid``'s output from its size argument, (N, C, H, W) -> (N, H, W, 2)."""
    from onnxruntime.tools.symbolic_shape_infer import get_shape_from_sympy_shape

    if flags[1] is None:
        return None
    size = get_shape_from_sympy_shape(list(flags[1]))
    return [size[0], *size[2:], len(size) - 2]


def _grid_sampler(g: Any, input: Any, grid: Any, *arguments: Any) -> Any:
    output = g.op(ATEN, input, grid, *arguments, operator_s=_GRID_SAMPLE)
    rank = symbolic_helper._get_tensor_rank(input)
    output.setType(input.type() if rank is None else input.type().with_sizes([None] * rank))
    return output


def _affine_grid(g: Any, theta: Any, size: Any, align_corners: Any) -> Any:
    output = g.op(ATEN, theta, size, align_corners, operator_s="affine_grid_generator")
    sizes = symbolic_helper._maybe_get_const(size, "is")
    if symbolic_helper._is_value(sizes):
        sizes = symbolic_helper._unpack_list(size) if symbolic_helper._is_packed_list(size) else None
    if sizes is not None:  # (N, H, W, 2) for a 4-d size, (N, D, H, W, 3) for a 5-d one
        output.setType(theta.type().with_sizes([None] * len(sizes)))
    return output


def _col2im(g: Any, input: Any, output_size: Any, *arguments: Any) -> Any:
    output = g.op(ATEN, input, output_size, *arguments, operator_s="col2im")
    rank = symbolic_helper._get_tensor_rank(input)  # (N, C * kernel, L) -> (N, C, H, W)
    if rank is not None:
        output.setType(input.type().with_sizes([None] * (rank + 1)))
    return output


def register() -> None:
    """Register the symbolics and gradients with ORT's registries (process-wide)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("grid_sampler", "", _grid_sampler)
    CustomOpSymbolicRegistry.register("affine_grid_generator", "", _affine_grid)
    CustomOpSymbolicRegistry.register("col2im", "", _col2im)
    register_gradient(
        _GRID_SAMPLE, f"{_GRID_SAMPLE}_backward", ["GO(0)", "I(0)", "I(1)", "I(2)", "I(3)", "I(4)"], ["GI(0)", "GI(1)"]
    )
    register_simple_gradient("affine_grid_generator", "affine_grid_generator_backward", ["GO(0)", "I(1)", "I(2)"])
    register_simple_gradient("col2im", "im2col", ["GO(0)", "I(2)", "I(3)", "I(4)", "I(5)"])
