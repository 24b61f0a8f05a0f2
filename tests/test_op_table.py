"""Every operator of the op registry runs through ORT like eager: one row per operator (``op_samples.py``).

Each row wraps its sample in ORTModule (ORT's fallback off: a failed export or run raises), trains it two
steps against an eager copy (outputs, parameter and input gradients, tight tolerances), and checks that ORT's
graph holds an ATen node running the operator, so that a silent fallback or another export form fails the
row. A drift test keeps the table and the registry one to one.
"""

from __future__ import annotations

import copy
from pathlib import Path

import onnx
import pytest
import torch
from op_samples import SAMPLES, Sample

from lightning_ort import engine
from lightning_ort.engine.ops import registry

_BY_OPERATOR = {sample.operator: sample for sample in SAMPLES}


def test_the_table_has_one_row_per_operator_of_the_registry() -> None:
    operators = [sample.operator for sample in SAMPLES]
    assert len(operators) == len(set(operators)), "an operator with two rows"
    assert set(operators) == {operator.qualified_name for operator in registry.OPERATORS}


def _inputs(sample: Sample) -> list[torch.Tensor]:
    """The sample's inputs; the float ones require gradients (the overloads that need every gradient)."""
    inputs = [torch.randn(spec) if isinstance(spec, tuple) else spec() for spec in sample.inputs]
    return [tensor.requires_grad_() if tensor.is_floating_point() else tensor for tensor in inputs]


def _operators(model: onnx.ModelProto | None) -> set[str]:
    assert model is not None, "ORT built no graph"
    return {engine.aten_operator(node) or node.op_type for node in model.graph.node}


@pytest.mark.parametrize("sample", SAMPLES, ids=[sample.operator for sample in SAMPLES])
def test_operator_trains_in_ort_like_eager(sample: Sample, tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = sample.module()
    reference = copy.deepcopy(module)
    options = engine.ORTRuntimeOptions(log_level="ERROR", channels_last=sample.channels_last)
    ort = engine.wrap_module(module, options)
    if sample.graph == "gradient":
        engine.save_graphs(ort, tmp_path, "row")
    tolerances = {"atol": 1e-5, "rtol": 1e-4, **sample.tolerances}
    for _ in range(2):
        inputs = _inputs(sample)
        twins = [tensor.detach().clone().requires_grad_(tensor.requires_grad) for tensor in inputs]
        output, expected = ort(*inputs), reference(*twins)
        assert type(output.grad_fn).__name__ == "_ORTModuleFunctionBackward", "the output is not ORT's"
        torch.testing.assert_close(output, expected, **tolerances)
        cotangent = torch.randn_like(expected)
        (output * cotangent).sum().backward()
        (expected * cotangent).sum().backward()
        for name, parameter in reference.named_parameters():
            torch.testing.assert_close(module.get_parameter(name).grad, parameter.grad, **tolerances, msg=name)
        for tensor, twin in zip(inputs, twins, strict=True):
            torch.testing.assert_close(tensor.grad, twin.grad, **tolerances)
    if sample.graph == "gradient":
        graph = onnx.load(engine.saved_graph_path(tmp_path, "row", "optimized", training=True))
    else:
        graph = engine.processed_model(ort, training=True)
    assert sample.operator in _operators(graph), f"{sample.operator} not in ORT's graph: {sorted(_operators(graph))}"
