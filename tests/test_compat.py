"""The compatibility layer on its own: ORTModule built by lightning_ort on the supported torch releases."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from lightning_ort import engine


class Attention(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=dropout, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def test_attention_dropout_is_active_in_training_and_gradients_flow() -> None:
    module = Attention(dropout=0.5)
    ort = engine.wrap_module(module, engine.ORTRuntimeOptions(log_level="ERROR"))
    x = torch.randn(4, 6, 16)
    first, second = ort(x), ort(x)
    assert not torch.allclose(first, second)  # fresh dropout masks: ORT did not export inference-mode Dropout
    second.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in module.parameters())
    nodes = [node.op_type for node in engine.exported_model(ort, training=True).graph.node]
    assert nodes.count("Dropout") >= 3  # attention weights, feed-forward, two residual branches


def test_eval_mode_matches_eager_without_touching_submodule_modes() -> None:
    module = Attention(dropout=0.1)
    reference = copy.deepcopy(module).eval()
    ort = engine.wrap_module(module, engine.ORTRuntimeOptions(log_level="ERROR"))
    module.eval()
    engine.set_training_flag(ort, graph=False, module_training=False)
    x = torch.randn(3, 5, 16)
    torch.testing.assert_close(ort(x), reference(x), rtol=1e-5, atol=1e-5)
    assert not any(m.training for m in module.modules())


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2


@pytest.mark.parametrize("owner", [torch.autograd.Function, torch._C._FunctionBase])
def test_export_guard_records_functions_whichever_apply_torch_defines(
    owner: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch 2.13 defines ``Function.apply`` as a Python classmethod, 2.14 and newer as
    ``_C._FunctionBase``'s C classmethod (no ``__func__``); the export guard's wrapper calls either."""
    from lightning_ort.engine.export.checks.custom_functions import record_autograd_functions

    apply = owner.__dict__["apply"]
    monkeypatch.setattr(torch.autograd.Function, "apply", apply)
    x = torch.ones(3, requires_grad=True)
    with record_autograd_functions() as seen:
        y = Double.apply(x)
    assert torch.autograd.Function.__dict__["apply"] is apply
    y.sum().backward()
    assert seen == [Double]
    assert torch.equal(y.detach(), torch.full((3,), 2.0)) and torch.equal(x.grad, torch.full((3,), 2.0))


def test_nvtx_ranges_are_harmless_on_cpu_torch() -> None:
    engine.ortmodule_package()
    torch.cuda.nvtx.range_push("x")
    torch.cuda.nvtx.range_pop()


def test_moved_torch_onnx_internals_resolve_to_the_torchscript_exporter() -> None:
    engine.ortmodule_package()
    from torch.onnx._internal import jit_utils
    from torch.onnx._internal.torchscript_exporter import jit_utils as moved

    assert jit_utils is moved


def test_dimension_names_become_identifiers_ort_can_parse() -> None:
    """torch names unknown dimensions after scoped node names; ORT's memory inspector parses them
    as sympy expressions, so they must be identifiers, renamed consistently and without clashes."""
    import onnx
    from onnx import TensorProto, helper

    from lightning_ort.engine.passes.dim_names import sanitize_dim_names

    scoped = "ATen/_original_module/layers.1/linear1/ATen_output_0_dim_0"
    clash = "ATen__original_module_layers_1_linear1_ATen_output_0_dim_0"
    values = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", scoped]),
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [scoped, clash, 3]),
    ]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", values[:1], values[1:])
    model = helper.make_model(graph)
    sanitize_dim_names(model)
    dims = [
        [dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]
        for value in [*model.graph.input, *model.graph.output]
    ]
    renamed = dims[0][1]
    assert dims == [["batch", renamed], [renamed, clash, 3]]
    assert renamed.isidentifier() and renamed != clash
    onnx.checker.check_model(model)
