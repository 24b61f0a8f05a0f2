"""Outputs a step does not use, and outputs that need no gradient.

- A parameter behind an output the loss does not use (a pooler's output, an auxiliary head used on
  some steps only) has no gradient in eager, and optimizers skip it. ORT returned zeros, so AdamW's
  weight decay and SGD's momentum moved it, silently (``engine/runtime/unused_outputs.py``).
- Two or more outputs that need no gradient (slices of an input, detached activations) crashed in
  backward: ORT marked only the last of them non-differentiable (``engine/runtime/backward_once.py``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base
from torch import nn
from torch.utils.data import DataLoader

STEPS = 5


class AuxHead(Base):
    """Returns (logits, auxiliary output); the auxiliary loss counts on the steps in ``aux_steps`` only."""

    def __init__(self, optimizer: str, aux_steps: tuple[int, ...]) -> None:
        super().__init__()
        self.optimizer, self.aux_steps = optimizer, aux_steps
        self.embedding = nn.Embedding(20, 16)
        self.head, self.aux = nn.Linear(16, 3), nn.Linear(16, 4)
        self.aux_grad_none: list[bool] = []

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.embedding(ids).mean(1)
        return self.head(hidden), self.aux(torch.tanh(hidden))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        logits, aux = self(batch[0])
        loss = F.cross_entropy(logits, batch[1])
        return loss + aux.pow(2).mean() if batch_idx in self.aux_steps else loss

    def on_after_backward(self) -> None:
        self.aux_grad_none.append(self.aux.weight.grad is None)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.optimizer == "adamw":  # weight_decay=0.01
            return torch.optim.AdamW(self.parameters(), lr=0.01)
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def _tokens() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    batches = [
        (torch.randint(0, 20, (n, t), generator=generator), torch.randint(0, 3, (n,), generator=generator))
        for n, t in ((4, 6), (6, 5), (4, 7), (5, 6), (6, 4))
    ]
    return DataLoader(batches, batch_size=None)


@pytest.mark.parametrize(("optimizer", "aux_steps"), [("adamw", ()), ("sgd", (0,)), ("adamw", (1, 3))])
def test_parameters_behind_unused_outputs_get_no_gradient(optimizer: str, aux_steps: tuple[int, ...]) -> None:
    eager, ort = fit_both(lambda: AuxHead(optimizer, aux_steps), _tokens, max_steps=STEPS)
    assert_ort_ran(ort, STEPS)
    assert ort.model.aux_grad_none == eager.model.aux_grad_none == [i not in aux_steps for i in range(STEPS)]
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class ConstantOutputs(Base):
    """Returns logits and outputs that need no gradient: two slices of its input, or two detached activations."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.body, self.head = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden = torch.tanh(self.body(x))
        if self.kind == "input-slices":
            return self.head(hidden), x[:, :2], x[:, 2:4] * 2
        return self.head(hidden), hidden.detach(), hidden.pow(2).detach()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        logits, first, second = self(batch[0])
        assert not first.requires_grad and not second.requires_grad
        return F.cross_entropy(logits, batch[1]) + 0.0 * (first.sum() + second.sum())


def _features() -> DataLoader:
    generator = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(n, 8, generator=generator), torch.randint(0, 3, (n,), generator=generator)) for n in (4, 6, 5)
    ]
    return DataLoader(batches, batch_size=None)


@pytest.mark.parametrize("kind", ["input-slices", "detached"])
def test_two_outputs_without_gradient_train(kind: str) -> None:
    eager, ort = fit_both(lambda: ConstantOutputs(kind), _features, max_steps=3)
    assert_ort_ran(ort, 3)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_output_cones_follow_subgraphs() -> None:
    """A value read only inside an ``If`` branch still counts as an input of the output."""
    from onnx import TensorProto, helper

    from lightning_ort.engine.runtime.unused_outputs import output_inputs

    branch = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["b_out"])],
        "branch",
        [],
        [helper.make_tensor_value_info("b_out", 1, None)],
    )
    graph = helper.make_graph(
        [
            helper.make_node("If", ["cond"], ["picked"], then_branch=branch, else_branch=branch),
            helper.make_node("Relu", ["x"], ["other"]),
        ],
        "g",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("cond", "w", "x")],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("picked", "other")],
    )
    assert output_inputs(helper.make_model(graph), ["picked", "other"]) == [frozenset({"cond", "w"}), frozenset({"x"})]


class FeaturesToo(Base):
    """Returns (logits, features, auxiliary output); the logits are computed from the features. ``watch``
    says what ``training_step`` hooks: ``features``, ``features-retained`` or ``auxiliary``."""

    def __init__(self, watch: str) -> None:
        super().__init__()
        self.watch = watch
        self.body, self.head, self.aux = nn.Linear(8, 16), nn.Linear(16, 3), nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = torch.tanh(self.body(x))
        return self.head(features), features, self.aux(features)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        logits, features, aux = self(batch[0])
        if self.watch == "features":
            features.register_hook(lambda grad: grad * 0.5)
        elif self.watch == "features-retained":
            features.retain_grad()
        else:
            aux.register_hook(lambda grad: grad * 0.5)
        return F.cross_entropy(logits, batch[1]) + 0.1 * features.pow(2).mean() + aux.pow(2).mean()


@pytest.mark.parametrize("watch", ["features", "features-retained"])
def test_a_hook_on_an_output_others_are_computed_from_is_refused(watch: str) -> None:
    from helpers import fit

    from lightning_ort import ORTUnsupportedModelError

    with pytest.raises(ORTUnsupportedModelError, match="output 1 of `FeaturesToo` has a gradient hook or retain_grad"):
        fit(FeaturesToo(watch), _features(), "ort", max_steps=2)


def test_a_hook_on_an_output_nothing_else_is_computed_from_trains_like_eager() -> None:
    eager, ort = fit_both(lambda: FeaturesToo("auxiliary"), _features, max_steps=3)
    assert_ort_ran(ort, 3)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
