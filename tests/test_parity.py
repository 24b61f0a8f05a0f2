"""Real models trained through real ORT match eager PyTorch: losses, weights and buffers."""

from __future__ import annotations

import copy
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit, fit_both, trainer_kwargs
from lightning.pytorch.callbacks import BaseFinetuning, ModelPruning
from models import (
    CNN,
    MLP,
    Base,
    ChildrenOnly,
    DetachModel,
    EncoderClassifier,
    TupleOutput,
    dict_loader,
    image_loader,
    mlp_loader,
)
from torch import nn
from torch.utils.data import DataLoader

from lightning_ort import ORTStrategy

STEPS = 16


@pytest.mark.parametrize("strategy", ["ort", ORTStrategy()], ids=["string", "object"])
def test_mlp(strategy: object) -> None:
    eager, ort = fit_both(MLP, mlp_loader, STEPS, strategy=strategy)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_cnn_batchnorm_statistics_follow_eager() -> None:
    eager, ort = fit_both(CNN, image_loader, STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    assert int(ort.state["features.1.num_batches_tracked"]) == STEPS
    assert not torch.equal(ort.state["features.1.running_var"], torch.ones(8))


def test_frozen_batchnorm_in_eval_mode_stays_frozen() -> None:
    class FrozenBN(CNN):
        def on_train_epoch_start(self) -> None:
            self.features[1].eval()

    eager, ort = fit_both(FrozenBN, image_loader, STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    assert int(ort.state["features.1.num_batches_tracked"]) == 0


class SharedAndSpareBatchNorm(CNN):
    """One BatchNorm applied twice per forward, and one never applied: eager counts 2 and 0 batches per step."""

    def __init__(self) -> None:
        super().__init__()
        self.spare = torch.nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.features[:2](x)
        hidden = self.features[1](torch.relu(hidden))
        return self.classifier(self.features[2:](hidden))


def test_batchnorm_counters_count_every_call_like_eager() -> None:
    eager, ort = fit_both(SharedAndSpareBatchNorm, image_loader, STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    assert int(ort.state["features.1.num_batches_tracked"]) == 2 * STEPS
    assert int(ort.state["spare.num_batches_tracked"]) == 0


def test_transformer_encoder_with_padding_mask_dict_input_and_dict_output() -> None:
    eager, ort = fit_both(EncoderClassifier, dict_loader, STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort, rtol=2e-5)
    assert_states_match(eager, ort)


def test_detach_stops_gradients_in_ort_as_in_eager() -> None:
    eager, ort = fit_both(DetachModel, mlp_loader, STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_tuple_output() -> None:
    eager, ort = fit_both(TupleOutput, mlp_loader, STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_smaller_last_batch() -> None:
    eager, ort = fit_both(MLP, lambda: mlp_loader(batch_size=24, n=100), STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_validation_runs_through_ort_too() -> None:
    eager, ort = fit_both(MLP, mlp_loader, 10, val=mlp_loader(), val_check_interval=5)
    # 10 training calls + 2 validation runs of 2 batches, all in ORT
    assert_ort_ran(ort, 14)
    assert eager.trainer.callback_metrics["val_loss"] == pytest.approx(
        float(ort.trainer.callback_metrics["val_loss"]), rel=1e-5
    )


def test_named_submodules() -> None:
    eager, ort = fit_both(EncoderClassifier, dict_loader, STEPS, strategy=ORTStrategy(modules=["encoder", "head"]))
    assert [report.name for report in ort.reports] == ["encoder", "head"]
    assert_ort_ran(ort, 2 * STEPS)
    assert_losses_match(eager, ort, rtol=2e-5)
    assert_states_match(eager, ort)


def test_steps_that_bypass_forward_get_children_wrapped() -> None:
    eager, ort = fit_both(ChildrenOnly, mlp_loader, STEPS)
    assert [report.name for report in ort.reports] == ["forward", "body", "head"]
    forward, body, head = ort.reports
    assert forward.ort_calls == forward.torch_calls == 0
    # the first step ran eagerly, the rest in ORT
    assert body.ort_calls == head.ort_calls == STEPS - 1
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class LayerList(Base):
    """Layers in an ``nn.ModuleList`` and heads in an ``nn.ModuleDict``, called by the steps directly."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(3)])
        self.heads = torch.nn.ModuleDict({"main": torch.nn.Linear(16, 3), "unused": torch.nn.Linear(16, 3)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.heads["main"](x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        h = batch[0]
        for layer in self.layers:
            h = torch.relu(layer(h))
        return F.cross_entropy(self.heads["main"](h), batch[1])


def test_containers_stand_for_their_items() -> None:
    """A ModuleList is never called itself: wrapped as such, its layers ran in PyTorch, unreported."""
    eager, ort = fit_both(LayerList, mlp_loader, STEPS)
    reports = {report.name: report for report in ort.reports}
    assert list(reports) == ["forward", "layers.0", "layers.1", "layers.2", "heads.main", "heads.unused"]
    assert all(reports[name].ort_calls == STEPS - 1 for name in ("layers.0", "layers.1", "layers.2", "heads.main"))
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    named = fit(LayerList(), mlp_loader(), ORTStrategy(modules=["layers"]), STEPS)
    assert [report.name for report in named.reports] == ["layers.0", "layers.1", "layers.2"]
    assert all(report.ort_calls == STEPS for report in named.reports)


class FreezeBatchNormToo(BaseFinetuning):
    """The documented custom fine-tuning recipe, BatchNorm frozen too: ``freeze(train_bn=False)`` sets
    ``track_running_stats=False``, which the export reads, and unfreezing sets it back."""

    def freeze_before_training(self, pl_module: L.LightningModule) -> None:
        self.freeze(pl_module.backbone, train_bn=False)

    def finetune_function(self, pl_module: L.LightningModule, epoch: int, optimizer: torch.optim.Optimizer) -> None:
        if epoch == 1:
            self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, train_bn=True)


class Backbone(Base):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU())
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=self.lr)


def test_fine_tuning_that_freezes_batch_norm_stays_in_ort() -> None:
    """It fell back to PyTorch at the unfreeze epoch (the changed value sent it there); ORT exports again now."""
    loader = lambda: mlp_loader(batch_size=16, n=48)  # noqa: E731
    eager, ort = fit_both(Backbone, loader, 9, callbacks=[FreezeBatchNormToo()])
    assert_ort_ran(ort, 9)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    assert ort.state["backbone.1.num_batches_tracked"] == 6


class DropoutMLP(MLP):
    def __init__(self) -> None:
        super().__init__(dropout=0.3)

    def predict_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self(batch[0])


def test_dropout_trains_in_ort_and_predict_matches_eager() -> None:
    eager, ort = fit_both(DropoutMLP, mlp_loader, STEPS)
    assert_ort_ran(ort, STEPS)
    # ORT draws its own dropout masks, so training losses differ from eager; they must stay finite
    assert all(torch.isfinite(torch.tensor(ort.losses)))
    x = torch.randn(24, 16)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=8)
    predictions = ort.trainer.predict(ort.model, loader)
    assert ort.trainer.strategy.ort_reports[0].ort_calls == 3
    reference = DropoutMLP().eval()
    reference.load_state_dict(ort.state)
    with torch.no_grad():
        expected = reference(x)
    torch.testing.assert_close(torch.cat(predictions), expected, rtol=1e-5, atol=1e-6)


class UnfreezeHead(MLP):
    """The head is frozen for the first steps and unfrozen mid-training."""

    def on_fit_start(self) -> None:
        self.head.requires_grad_(False)

    def on_train_batch_start(self, batch: object, batch_idx: int) -> None:
        if batch_idx == 5:
            self.head.requires_grad_(True)


def test_unfreezing_a_layer_mid_training_is_seen_by_ort() -> None:
    eager, ort = fit_both(UnfreezeHead, mlp_loader, STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    assert not torch.equal(ort.state["head.weight"], UnfreezeHead().state_dict()["head.weight"])


class DefaultEncoder(EncoderClassifier):
    """nn.TransformerEncoderLayer with its defaults: dropout 0.1, nested-tensor fast path in eval."""

    def __init__(self) -> None:
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(32, nhead=4, dim_feedforward=64, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, num_layers=2)

    def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self(batch)["logits"]


def test_default_transformer_encoder_trains_and_predicts_in_ort() -> None:
    eager, ort = fit_both(DefaultEncoder, dict_loader, STEPS, val=dict_loader(), val_check_interval=10)
    assert_ort_ran(ort, STEPS + 2)  # training, and one validation (2 batches) through the inference graph
    assert abs(eager.losses[-1] - ort.losses[-1]) < 0.1  # different dropout masks, same learning
    # ORT's inference graph (traced without PyTorch's fused fast path) predicts what eager eval does
    predictions = torch.cat(ort.trainer.predict(ort.model, dict_loader()))
    assert ort.trainer.strategy.ort_reports[0].ort_calls == len(dict_loader())
    reference = DefaultEncoder()
    reference.load_state_dict(ort.state)
    reference.eval()
    with torch.no_grad():
        expected = torch.cat([reference(batch)["logits"] for batch in dict_loader()])
    torch.testing.assert_close(predictions, expected, rtol=1e-4, atol=1e-5)


class ChildrenOnlyEverywhere(ChildrenOnly):
    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", F.cross_entropy(self.head(self.body(x)), y))


def test_test_stage_runs_through_ort_and_switches_to_children() -> None:
    torch.manual_seed(0)
    model = ChildrenOnlyEverywhere()
    reference = copy.deepcopy(model)
    trainer = L.Trainer(strategy="ort", **trainer_kwargs(limit_test_batches=4))
    (ort_metrics,) = trainer.test(model, mlp_loader())
    (eager_metrics,) = L.Trainer(**trainer_kwargs(limit_test_batches=4)).test(reference, mlp_loader())
    names = [report.name for report in trainer.strategy.ort_reports]
    assert names == ["forward", "body", "head"]
    assert [r.ort_calls for r in trainer.strategy.ort_reports] == [0, 3, 3]
    assert ort_metrics["test_loss"] == pytest.approx(eager_metrics["test_loss"], rel=1e-5)


class TanhCNN(CNN):
    """A subclass whose forward extends its parent's with zero-argument super()."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(super().forward(x))


def test_subclass_forward_calling_super_trains_in_ort() -> None:
    eager, ort = fit_both(TanhCNN, image_loader, STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class Snapshot(L.Callback):
    """Deep-copies the module after every step (EMA, teacher and best-model snapshots do)."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self.copy = copy.deepcopy(pl_module)


def test_a_deep_copy_taken_during_fit_runs_in_pytorch() -> None:
    """The copy got a copy of the guard and its ORTModule, which failed at its first call."""
    snapshot = Snapshot()
    torch.manual_seed(0)
    run = fit(MLP(), mlp_loader(), "ort", 3, callbacks=[snapshot])
    assert_ort_ran(run, 3)
    x = torch.randn(4, 16)
    run.model.eval()
    snapshot.copy.eval()
    with torch.no_grad():
        torch.testing.assert_close(snapshot.copy(x), run.model(x), rtol=0, atol=0)
    snapshot.copy.train()
    snapshot.copy(x).sum().backward()
    assert all(parameter.grad is not None for parameter in snapshot.copy.parameters())


class WeightNormalised(MLP):
    """The first layer under (old-style) weight normalisation."""

    def __init__(self) -> None:
        super().__init__()
        torch.nn.utils.weight_norm(self.body[0])


@pytest.mark.parametrize("hooks", ["pruning", "weight-norm"])
def test_hooked_weights_are_the_ones_the_last_forward_computed(hooks: str) -> None:
    """Pruning and weight normalisation hooks set ``weight`` before each forward, which ORT's graph computes
    instead: the attribute stayed as the export left it, and ModelPruning's next round ranked stale weights
    (3 of 512 mask entries differed after two epochs, and the losses from the third)."""
    runs = []
    for strategy in ("auto", "ort"):
        torch.manual_seed(0)  # weight_norm's non-leaf weight cannot be deep-copied: the same seed instead
        model = MLP() if hooks == "pruning" else WeightNormalised()
        callbacks = (
            [ModelPruning("l1_unstructured", amount=0.3, make_pruning_permanent=False)] if hooks == "pruning" else []
        )
        runs.append(fit(model, mlp_loader(16, 48), strategy, -1, max_epochs=3, callbacks=callbacks))
    eager, ort = runs
    assert_ort_ran(ort, 9)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)  # pruning masks included
    for name in ("body.0", "body.3", "head"):
        expected = eager.model.get_submodule(name).weight.detach()
        torch.testing.assert_close(ort.model.get_submodule(name).weight, expected)


class PrunedNormalised(Base):
    """A pruned layer before a BatchNorm: the module cannot be deep-copied, so ORT ran it once more for its
    output schema, and the export counted two BatchNorm calls per forward (``num_batches_tracked`` 10 after
    five steps, against eager's 5)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.bn, self.head = nn.Linear(16, 16), nn.BatchNorm1d(16), nn.Linear(16, 3)
        torch.nn.utils.prune.l1_unstructured(self.lin, "weight", amount=0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.bn(self.lin(x))))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


def test_a_module_ort_cannot_copy_counts_batch_norm_batches_like_eager() -> None:
    runs = []
    for strategy in ("auto", "ort"):
        torch.manual_seed(0)
        runs.append(fit(PrunedNormalised(), mlp_loader(16, 80), strategy, 5))
    eager, ort = runs
    assert_ort_ran(ort, 5)
    assert int(ort.state["bn.num_batches_tracked"]) == int(eager.state["bn.num_batches_tracked"]) == 5
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class SharedNormOnTwoInputs(Base):
    """One BatchNorm on two inputs that do not depend on each other (a siamese network); the distances read
    the second first, which made ORT run that call first."""

    def __init__(self, frozen: bool) -> None:
        super().__init__()
        self.lin, self.bn = nn.Linear(4, 4), nn.BatchNorm1d(4)
        if frozen:
            self.bn.eval()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        za, zb = self.bn(self.lin(a)), self.bn(self.lin(b))
        return ((zb[None] - za[:, None, :]) ** 2).sum(-1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(*batch).mean()


def _pairs() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    pairs = [(torch.randn(6, 4, generator=g) + 1.0, torch.randn(5, 4, generator=g) - 1.0) for _ in range(3)]
    return DataLoader(pairs, batch_size=None)


def test_one_batch_norm_on_independent_inputs_falls_back_with_the_reason() -> None:
    """ORT ran the second call first: weights equal, running statistics off by 0.025 after one step."""
    eager, ort = fit_both(lambda: SharedNormOnTwoInputs(frozen=False), _pairs, 3, strategy=ORTStrategy(fullgraph=True))
    (report,) = ort.reports
    assert report.fallback_reason is not None and "BatchNorm layer(s) bn are called more than once" in (
        report.fallback_reason
    )
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort, atol=0, rtol=0)


def test_a_frozen_batch_norm_on_independent_inputs_trains_in_ort() -> None:
    eager, ort = fit_both(lambda: SharedNormOnTwoInputs(frozen=True), _pairs, 3)
    assert_ort_ran(ort, 3)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class TwoOptimizersToggled(Base):
    """Manual optimization with ``toggle_optimizer`` (GAN-style): Lightning keeps a dict keyed by parameters
    on the module, which lightning_ort's look at the module's Python state printed (a tensor repr, whose
    ``no_grad`` the export took for the forward's) and fell back."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.body, self.head, self.aux = nn.Linear(16, 24), nn.Linear(24, 3), nn.Linear(24, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.body(x))
        return self.head(h), self.aux(h)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        shared = list(self.body.parameters())
        return [
            torch.optim.SGD(shared + list(self.head.parameters()), lr=0.05, momentum=0.9),
            torch.optim.Adam(shared + list(self.aux.parameters()), lr=0.01),
        ]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        losses = []
        for index, optimizer in enumerate(self.optimizers()):
            self.toggle_optimizer(optimizer)
            loss = F.cross_entropy(self(x)[index], y)
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
            self.untoggle_optimizer(optimizer)
            losses.append(loss.detach())
        return sum(losses)


def test_toggled_optimizers_train_in_ort_like_eager() -> None:
    eager, ort = fit_both(TwoOptimizersToggled, mlp_loader, 8)  # two optimizer steps per batch
    assert_ort_ran(ort, 8)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
