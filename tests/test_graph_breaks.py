"""Graph breaks at module granularity: a module ORT cannot run as a whole hands its submodules to ORT."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_states_match, fit_both
from models import Base, mlp_loader
from torch import nn
from torch.utils.checkpoint import checkpoint

from lightning_ort import ORTFallbackError, ORTStrategy
from lightning_ort.guard import _IN_BACKWARD


class Gated(nn.Module):
    """Python control flow on a tensor value between two linear layers: refused, its layers are not."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.gate = nn.Linear(16, 32), nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.inner(x))
        if hidden.mean() > 0:
            hidden = hidden * 2
        return torch.tanh(self.gate(hidden))


class Nested(Base):
    """The LightningModule's forward is refused (a data-dependent branch), ``encoder``'s too; ``norm_embedding``
    renormalises its rows in place (``max_norm``), which no graph can train, so it stays in PyTorch."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Gated()
        self.norm_embedding = nn.Embedding(16, 32, max_norm=1.0)
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(x) + self.norm_embedding(x.argmax(-1))
        if hidden.sum() > 0:
            hidden = -hidden
        return self.head(hidden)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


def _parameters(module: nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters())


def test_nested_graph_breaks_train_every_trainable_leaf_in_ort() -> None:
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        eager, ort = fit_both(Nested, mlp_loader, 10)
    reports = {report.name: report for report in ort.reports}
    assert list(reports) == ["forward", "encoder", "norm_embedding", "head", "encoder.inner", "encoder.gate"]
    assert reports["forward"].submodules == ["encoder", "norm_embedding", "head"]
    assert reports["encoder"].submodules == ["encoder.inner", "encoder.gate"]
    # the forward's reason is the first refusal its checks find (the embedding's, or the branch)
    assert reports["forward"].fallback_reason is not None
    assert "control flow or values that depend on tensor data" in (reports["encoder"].fallback_reason or "")
    for name in ("forward", "encoder"):
        assert reports[name].ort_calls == 0 and reports[name].torch_calls == 10
    embedding = reports["norm_embedding"]
    assert embedding.submodules == [] and "weight in place" in (embedding.fallback_reason or "")
    for name in ("head", "encoder.inner", "encoder.gate"):
        assert reports[name].fallback_reason is None and reports[name].ort_calls == 10, reports[name]
    model = ort.model
    expected = 1 - _parameters(model.norm_embedding) / _parameters(model)
    assert ort.trainer.strategy.ort_parameter_share == pytest.approx(expected)
    ours = [str(r.message) for r in records if "lightning_ort: ORT cannot run" in str(r.message)]
    assert "ORT runs its submodules `encoder`, `norm_embedding`, `head` instead" in ours[0], ours
    assert any("`encoder` (Gated)" in message and "`encoder.inner`, `encoder.gate`" in message for message in ours)
    assert len(ours) == len({message.partition("Reason: ")[2] for message in ours}), "a reason was warned twice"
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_fullgraph_runs_the_refused_module_in_pytorch_as_a_whole() -> None:
    eager, ort = fit_both(Nested, mlp_loader, 4, strategy=ORTStrategy(fullgraph=True))
    (report,) = ort.reports
    assert report.fallback_reason is not None and report.submodules == [] and report.torch_calls == 4
    assert ort.trainer.strategy.ort_parameter_share == 0
    assert_losses_match(eager, ort, rtol=0)
    assert_states_match(eager, ort, atol=0, rtol=0)


def test_raise_stops_at_the_first_refusal_without_graph_breaks() -> None:
    with pytest.raises(ORTFallbackError, match="ORT cannot run `forward`"):
        fit_both(Nested, mlp_loader, 2, strategy=ORTStrategy(fallback="raise"))


class ReentrantCheckpoint(Base):
    """A reentrant checkpoint (refused as a whole) around ``body``: its first forward runs under no_grad, and
    autograd calls it again in the backward pass to recompute it."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(16, 32)
        self.body = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(checkpoint(self.body, self.stem(x), use_reentrant=True))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


def test_a_submodule_recomputed_in_backward_runs_in_pytorch() -> None:
    eager, ort = fit_both(ReentrantCheckpoint, mlp_loader, 6)
    forward, stem, body, head = ort.reports
    assert stem.fallback_reason is None and stem.ort_calls == 6
    assert forward.submodules == ["stem", "body", "head"] and "use_reentrant=False" in (forward.fallback_reason or "")
    assert head.fallback_reason is None and head.ort_calls == 6
    assert body.fallback_reason is None and body.ort_calls == 0
    assert body.torch_call_reasons.get(_IN_BACKWARD) == 6, body.torch_call_reasons
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


_COLLECTED: list[torch.Tensor] = []


class LazilyHooked(Base):
    """Adds a forward hook to ``layer`` on its first call and marks that with an attribute, as transformers'
    output capturing does; the hook's output is part of the result. The refused export put the attribute back
    but not the hook, so PyTorch's rerun added a second one: the output then counted ``layer``'s twice."""

    def __init__(self) -> None:
        super().__init__()
        self.layer, self.head = nn.Linear(16, 32), nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not getattr(self, "_hooked", False):
            self.layer.register_forward_hook(lambda module, args, output: _COLLECTED.append(output))
            self._hooked = True
        _COLLECTED.clear()
        hidden = torch.tanh(self.layer(x))
        return self.head(hidden + sum(_COLLECTED))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


def test_hooks_a_refused_forward_added_are_removed_with_its_attributes() -> None:
    eager, ort = fit_both(LazilyHooked, mlp_loader, 4)
    reports = {report.name: report for report in ort.reports}
    assert "_hooked" in (reports["forward"].fallback_reason or ""), reports["forward"]
    assert len(ort.model.layer._forward_hooks) == 1
    assert reports["head"].ort_calls == 4
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
