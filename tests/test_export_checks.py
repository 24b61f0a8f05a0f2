"""The export checks as one ordered list (``engine/export/export_guard.py``): the order recorders nest in, the
order checks refuse in, and a module with several problems refused for the first one, as before the list."""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

from lightning_ort import engine
from lightning_ort.engine.export.export_guard import EXPORT_CHECKS, RECORDERS
from lightning_ort.errors import ORTUnsupportedModelError


def test_checks_refuse_in_this_order() -> None:
    assert [check.name for check in EXPORT_CHECKS] == [
        "cumulative_batch_norm", "sparse_embeddings", "spectral_norms",  # before the export
        "unsupported_calls", "reentrant_checkpoint", "custom_functions", "grad_switched_off", "no_grad_regions",
        "checkpointed_norms", "python_random_draws", "stored_tensors", "python_attributes", "buffer_updates",
        "replaced_buffers", "parameters_in_place", "inputs_in_place", "index_conversions", "size_tensors",
        "varying_iterations", "counted_splits", "number_output", "data_dependent",
    ]  # fmt: skip
    # when ORT's export itself raised: calls it cannot train, then a reentrant checkpoint, then buffer writes
    assert [check.name for check in EXPORT_CHECKS if check.failure is not None] == [
        "unsupported_calls",
        "reentrant_checkpoint",
        "buffer_updates",
    ]


def test_recorders_nest_in_this_order() -> None:
    assert [recorder.name for recorder in RECORDERS] == [
        "parameter_versions", "random_states", "exporting", "buffers", "batch_norm_calls", "python_reads",
        "index_conversions", "warnings", "traced_calls", "iterations", "fixed_size_numbers", "size_decisions",
        "input_copies", "torchscript_exporter", "attention_fast_path_off", "exported_sdpa", "autograd_functions",
        "grad_regions", "stored_tensors", "random_draws", "checkpointed_norms",
    ]  # fmt: skip


def test_every_check_reads_entered_recorders_only() -> None:
    names = [check.name for check in EXPORT_CHECKS]
    assert len(set(names)) == len(names)
    for check in EXPORT_CHECKS:
        assert check.problem is not None or check.failure is not None, check.name
        if check.before_export:
            assert check.reads == () and check.failure is None, check.name
        assert all(recorder in RECORDERS for recorder in check.reads), check.name


class DrawsAndStores(nn.Module):
    """A Python random draw, a tensor stored on the module and a Python attribute changed."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        h = self.layer(x)
        self.aux = h.sum()
        return h * random.random()


class BufferAndIndex(nn.Module):
    """A buffer updated in place, a size turned into a Python integer and a branch on data."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        h = self.layer(x)
        for _ in range(x.shape[0]):
            h = h + 0
        if h.sum() > 0:
            h = h * 2
        return h


class SwitchedAndNoGrad(nn.Module):
    """set_grad_enabled(False), an unsafe torch.no_grad() region, an input changed in place."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        torch.set_grad_enabled(False)
        y = self.layer(x)
        torch.set_grad_enabled(True)
        with torch.no_grad():
            z = self.layer(x)
        return self.layer(x) + y + z


class SparseAndSpectral(nn.Module):
    """Checks before the export: a cumulative BatchNorm, a sparse embedding, an updating spectral norm."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(10, 4, sparse=True)
        self.layer = nn.utils.parametrizations.spectral_norm(nn.Linear(4, 4))
        self.norm = nn.BatchNorm1d(4, momentum=None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.layer(self.embedding(x)))


class IterateAndNumber(nn.Module):
    """An iteration over the batch dimension and a Python number among the outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, float]:
        h = self.layer(x)
        parts = sum(1 for _ in h)
        return h * parts, float(h.sum())


# The refusal each gave before the checks became one list (lightning_ort at c29a89b)
CASES = [
    (DrawsAndStores, lambda: torch.randn(8, 4), "its forward draws a Python or NumPy random number at"),
    (BufferAndIndex, lambda: torch.randn(8, 4), "its forward updates buffer(s) count in place"),
    (SwitchedAndNoGrad, lambda: torch.randn(8, 4), "its forward turns gradients off with set_grad_enabled(False)"),
    (SparseAndSpectral, lambda: torch.randint(0, 10, (8,)), "BatchNorm layer(s) norm use momentum=None"),
    (IterateAndNumber, lambda: torch.randn(8, 4), "its forward iterates over a tensor at"),
]


@pytest.mark.parametrize(("model_cls", "inputs", "refusal"), CASES, ids=[case[0].__name__ for case in CASES])
def test_a_module_with_several_problems_is_refused_for_the_first(
    model_cls: type[nn.Module], inputs: Callable[[], torch.Tensor], refusal: str
) -> None:
    ort = engine.wrap_module(model_cls().train(), engine.ORTRuntimeOptions(log_level="ERROR"))
    with warnings.catch_warnings(), pytest.raises(ORTUnsupportedModelError) as error:
        warnings.simplefilter("ignore")
        ort(inputs())
    assert str(error.value).startswith(refusal)
