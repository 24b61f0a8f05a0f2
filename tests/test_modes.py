"""Train/eval modes that change during training: ORT's graphs bake every submodule's mode in, so a
change must give a new export, never a stale graph (compared with eager PyTorch, buffers included)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit, fit_both
from models import CNN, MLP, image_loader, mlp_loader

from lightning_ort import guard

STEPS = 8


class FreezeBatchNormMidway(CNN):
    """Fine-tuning schedules freeze BatchNorm statistics after some steps."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.global_step == 3:
            self.features[1].eval()
        if self.global_step == 6:
            self.features[1].train()


def test_batchnorm_switched_to_eval_and_back_mid_training() -> None:
    eager, ort = fit_both(FreezeBatchNormMidway, image_loader, STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    assert int(ort.state["features.1.num_batches_tracked"]) == 3 + (STEPS - 6)


class EvalModeFineTuning(MLP):
    """The whole model is put in eval mode before fit (Lightning keeps it); it still trains."""

    def __init__(self) -> None:
        super().__init__(dropout=0.5)
        self.eval()

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        assert not self.training and not self.body[2].training
        return super().training_step(batch, batch_idx)


def test_module_in_eval_mode_still_trains_through_ort() -> None:
    eager, ort = fit_both(EvalModeFineTuning, mlp_loader, STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)  # dropout is off in both: eval mode is kept inside the graph
    assert_states_match(eager, ort)


class EvalAndTrainOutputsInOneLoss(CNN):
    """One loss over a forward in eval mode and one in train mode (consistency regularisation): a new
    export for the second call, before the first one's backward, killed the process (SIGSEGV)."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        self.eval()
        reference = self(x)
        self.train()
        return F.cross_entropy(self(x), y) + 0.1 * F.cross_entropy(reference, y)


def test_eval_and_train_calls_before_one_backward_train_like_eager() -> None:
    eager, ort = fit_both(EvalAndTrainOutputsInOneLoss, image_loader, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    (report,) = ort.reports
    # ORT runs the eval-mode call; the train-mode one, whose graph would need a new export while the
    # first call's backward is pending, runs in PyTorch
    assert report.fallback_reason is None and report.ort_calls == 4 and report.torch_calls == 4
    ((reason, calls),) = report.torch_call_reasons.items()
    assert "changed before the previous call's backward" in reason and calls == 4


class TwoInputStructuresInOneLoss(MLP):
    """Two calls in one step with inputs ORT exports separately (``model(x)``, then ``model(x, offset)``;
    a 2-D and a 3-D input): the second export, before the first call's backward, crashed or killed the
    process (SIGSEGV)."""

    def forward(self, x: torch.Tensor, offset: torch.Tensor | None = None) -> torch.Tensor:  # type: ignore[override]
        features = self.body(x if offset is None else x + offset)
        return self.head(features)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        plain, shifted = self(x), self(x, torch.full_like(x, 0.1))
        stacked = self(x[:, None]).squeeze(1)
        return F.cross_entropy(plain, y) + F.cross_entropy(shifted, y) + 0.1 * F.cross_entropy(stacked, y)


def test_calls_with_other_inputs_before_one_backward_train_like_eager() -> None:
    eager, ort = fit_both(TwoInputStructuresInOneLoss, mlp_loader, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    (report,) = ort.reports
    assert report.fallback_reason is None and report.ort_calls == 4 and report.torch_calls == 8
    assert report.torch_call_reasons == {guard._INPUTS_BEFORE_BACKWARD: 8}


class SubmoduleCalledBeforeTheModel(CNN):
    """A submodule with BatchNorm called in eager before the first (exporting) ORT call of the whole model:
    the export put back the running statistics it changed, which raised the version autograd had saved, and
    the eager call's backward failed ("modified by an inplace operation")."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        features = self.features(x)
        return F.cross_entropy(self(x), y) + 0.1 * features.pow(2).mean()


def test_submodule_called_in_eager_before_the_export_trains_like_eager() -> None:
    eager, ort = fit_both(SubmoduleCalledBeforeTheModel, image_loader, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class EvaluatesWithGradInACallback(CNN):
    """The model called in eval mode with gradients on after every step (an output thrown away): a new export
    at each switch of modes would cost more than the step; such calls run in PyTorch. Its pending backward
    made every later training call run in PyTorch before."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.eval()
        self(batch[0]).sum().item()
        self.train()


class SwitchesToEvalForGood(CNN):
    """The whole model kept in eval mode from step 2 (frozen statistics for the last steps): after a few calls
    in those modes ORT exports for them."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if batch_idx >= 2:
            self.eval()


def test_eval_calls_with_grad_between_training_calls_run_in_pytorch() -> None:
    eager, ort = fit_both(EvaluatesWithGradInACallback, image_loader, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    (report,) = ort.reports
    assert report.fallback_reason is None and report.ort_calls == STEPS
    assert report.torch_call_reasons == {guard._EVAL_CALL_WITH_GRAD: STEPS}


def test_a_lasting_switch_to_eval_mode_is_exported() -> None:
    eager, ort = fit_both(SwitchesToEvalForGood, image_loader, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    (report,) = ort.reports
    waited = guard._LASTING_MODES - 1
    assert report.ort_calls == STEPS - waited
    assert report.torch_call_reasons == {guard._EVAL_CALL_WITH_GRAD: waited}


class TeacherInTrainModeUnderNoGrad(CNN):
    """A distillation-style reference output computed under ``no_grad`` with the module left in train
    mode: PyTorch runs that call (it updates BatchNorm's statistics), and the report says why."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        with torch.no_grad():
            reference = self(x)
        return F.cross_entropy(self(x), y) + 0.1 * F.mse_loss(self(x), reference)


def test_training_mode_call_under_no_grad_runs_in_pytorch_with_the_reason() -> None:
    eager, ort = fit_both(TeacherInTrainModeUnderNoGrad, image_loader, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    (report,) = ort.reports
    assert report.uses_ort and report.ort_calls == 8 and report.torch_calls == 4
    assert report.torch_call_reasons == {guard._TRAINING_UNDER_NO_GRAD: 4}


class TestTimeAdaptation(CNN):
    """Validation adapts BatchNorm's statistics to its data: the layer alone in train mode, under no_grad
    (ORT's inference graph, exported with that layer in train mode), before the scored call."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.features[1].train()
        self(x)
        self.features[1].eval()
        self.log("val_loss", F.cross_entropy(self(x), y))


def test_batchnorm_in_train_mode_in_the_inference_graph_counts_its_batches() -> None:
    eager, ort = fit_both(
        TestTimeAdaptation, image_loader, 4, val=image_loader(), limit_val_batches=2, val_check_interval=2
    )
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)  # num_batches_tracked included: 4 training steps, 2 x 2 adapting calls
    assert int(ort.state["features.1.num_batches_tracked"]) == 4 + 4


class Summarised(MLP):
    """An ``example_input_array``: Lightning's model summary calls the model on it with its own hooks."""

    def __init__(self) -> None:
        super().__init__()
        self.example_input_array = torch.zeros(4, 16)


def test_the_model_summary_call_runs_in_pytorch_and_leaves_ort_the_rest() -> None:
    result = fit(Summarised(), mlp_loader(), "ort", max_steps=4, val=mlp_loader(), val_check_interval=2,
                 enable_model_summary=True)  # fmt: skip
    (report,) = result.reports
    assert report.fallback_reason is None and report.eval_fallback_reason is None
    assert report.torch_call_reasons == {guard._MODEL_SUMMARY: 1}
    assert report.ort_calls == 4 + 2 * 2  # training steps and validation batches
