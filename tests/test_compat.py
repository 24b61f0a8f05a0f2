"""The compatibility layer on its own: ORTModule built by lightning_ort on torch 2.13."""

from __future__ import annotations

import copy

import torch
from torch import nn

from lightning_ort import _compat


class Attention(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=dropout, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def test_attention_dropout_is_active_in_training_and_gradients_flow() -> None:
    module = Attention(dropout=0.5)
    ort = _compat.wrap_module(module, _compat.ORTRuntimeOptions(log_level="ERROR"))
    x = torch.randn(4, 6, 16)
    first, second = ort(x), ort(x)
    assert not torch.allclose(first, second)  # fresh dropout masks: ORT did not export inference-mode Dropout
    second.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in module.parameters())
    nodes = [node.op_type for node in _compat.exported_model(ort, training=True).graph.node]
    assert nodes.count("Dropout") >= 3  # attention weights, feed-forward, two residual branches


def test_eval_mode_matches_eager_without_touching_submodule_modes() -> None:
    module = Attention(dropout=0.1)
    reference = copy.deepcopy(module).eval()
    ort = _compat.wrap_module(module, _compat.ORTRuntimeOptions(log_level="ERROR"))
    module.eval()
    _compat.set_training_flag(ort, graph=False, module_training=False)
    x = torch.randn(3, 5, 16)
    torch.testing.assert_close(ort(x), reference(x), rtol=1e-5, atol=1e-5)
    assert not any(m.training for m in module.modules())


def test_nvtx_ranges_are_harmless_on_cpu_torch() -> None:
    _compat.ortmodule_package()
    torch.cuda.nvtx.range_push("x")
    torch.cuda.nvtx.range_pop()


def test_moved_torch_onnx_internals_resolve_to_the_torchscript_exporter() -> None:
    _compat.ortmodule_package()
    from torch.onnx._internal import jit_utils
    from torch.onnx._internal.torchscript_exporter import jit_utils as moved

    assert jit_utils is moved
