"""Calls ORT's graph cannot follow get a clear error or a clear fallback, never a crash or wrong training:
a second backward through one forward, gradients differentiated again (create_graph=True), Python
bool/int/float/None arguments of forward, and inputs that require grad in one call and not the next."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit, fit_both
from models import mlp_loader
from torch import nn

from lightning_ort import ORTStrategy
from lightning_ort.errors import ORTUnsupportedModelError

STEPS = 6
SECOND_BACKWARD = "ORT cannot run the backward pass of `{}` a second time for one forward call"
DOUBLE_BACKWARD = "ORT cannot differentiate the backward pass of `{}` again"


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class TwoLossesRetainGraph(Net):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        optimizer = self.optimizers()
        optimizer.zero_grad()
        out = self(x)
        first, second = F.cross_entropy(out, y), out.pow(2).mean()
        self.manual_backward(first, retain_graph=True)
        self.manual_backward(0.1 * second)
        optimizer.step()
        return first + 0.1 * second


class InputGradientThenBackward(Net):
    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        x = x.clone().requires_grad_(True)
        out = self(x)
        (saliency,) = torch.autograd.grad(out.sum(), x, retain_graph=True)
        self.log("saliency", saliency.norm())
        return F.cross_entropy(out, y)


class GradientPenalty(Net):
    """WGAN-GP / R1 style: the penalty differentiates the gradient of the module's output."""

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        x = x.clone().requires_grad_(True)
        out = self(x)
        (grad,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        return F.cross_entropy(out, y) + 0.5 * grad.pow(2).sum(1).mean()


class SeparatePenaltyForward(Net):
    """One backward per forward, but the penalty's gradient is ORT's gradient differentiated again.

    Before the check, ORT's gradient had no history: the penalty trained as if it were constant."""

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        real, fake = x.clone().requires_grad_(True), x.flip(0).requires_grad_(True)
        (grad,) = torch.autograd.grad(self(real).sum(), real, create_graph=True)
        return F.cross_entropy(self(fake), y) + 0.5 * grad.pow(2).sum(1).mean()


class CreateGraphOnlyOnce(Net):
    """create_graph=True whose gradients are never differentiated again trains as in eager."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        optimizer = self.optimizers()
        optimizer.zero_grad()
        loss = F.cross_entropy(self(x), y)
        self.manual_backward(loss, create_graph=True)
        optimizer.step()
        return loss


@pytest.mark.parametrize("model", [TwoLossesRetainGraph, InputGradientThenBackward])
def test_second_backward_through_one_forward_is_a_clear_error(model: type[Net]) -> None:
    torch.manual_seed(0)
    with pytest.raises(ORTUnsupportedModelError, match=SECOND_BACKWARD.format(model.__name__)) as error:
        fit(model(), mlp_loader(), ORTStrategy(), STEPS)
    assert "Fix: keep" in str(error.value) and "call backward once" in str(error.value)


@pytest.mark.parametrize("model", [GradientPenalty, SeparatePenaltyForward])
def test_differentiating_ort_gradients_again_is_a_clear_error(model: type[Net]) -> None:
    torch.manual_seed(0)
    with pytest.raises(ORTUnsupportedModelError, match=DOUBLE_BACKWARD.format(model.__name__)) as error:
        fit(model(), mlp_loader(), ORTStrategy(), STEPS)
    assert "strategy='auto'" in str(error.value)


class PenaltyOnOneSubmodule(Net):
    """A generator in ORT feeds a critic with a gradient penalty, which the fix keeps in PyTorch."""

    def __init__(self) -> None:
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.critic = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        real = x.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(self.critic(real).sum(), real, create_graph=True)
        return F.cross_entropy(self.critic(self.generator(x)), y) + 0.5 * grad.pow(2).sum(1).mean()


def test_gradient_penalty_trains_with_the_fix_the_error_names() -> None:
    with pytest.raises(ORTUnsupportedModelError, match=DOUBLE_BACKWARD.format("Sequential")):
        fit_both(PenaltyOnOneSubmodule, mlp_loader, STEPS, strategy=ORTStrategy(modules=["generator", "critic"]))
    eager, ort = fit_both(PenaltyOnOneSubmodule, mlp_loader, STEPS, strategy=ORTStrategy(modules=["generator"]))
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_create_graph_without_second_differentiation_matches_eager() -> None:
    eager, ort = fit_both(CreateGraphOnlyOnce, mlp_loader, STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class AdversarialStep(Net):
    """FGSM: the input's gradient, then a forward on the perturbed input that needs none, and back.

    ORT rebuilt its gradient graph for the second forward still asking for the input's gradient,
    and failed (op_rewrites) or computed it for nothing."""

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        x = x.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(F.cross_entropy(self(x), y), x)
        self.log("grad_norm", grad.norm())
        return F.cross_entropy(self((x + 0.1 * grad.sign()).detach()), y)


@pytest.mark.parametrize("op_rewrites", [True, False])
def test_inputs_that_alternate_requiring_grad_train_like_eager(op_rewrites: bool) -> None:
    eager, ort = fit_both(AdversarialStep, mlp_loader, STEPS, strategy=ORTStrategy(op_rewrites=op_rewrites))
    assert_ort_ran(ort, 2 * STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class NumberArgument(Net):
    """A float and an int argument whose values change from call to call."""

    def forward(self, x: torch.Tensor, scale: float, shift: int = 0) -> torch.Tensor:  # type: ignore[override]
        return self.b(torch.relu(self.a(x)) * scale + shift)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x, (0.5, 3.0, -1.0)[batch_idx % 3], shift=batch_idx), y)


class FlagArgument(Net):
    def forward(self, x: torch.Tensor, return_features: bool = False) -> torch.Tensor:  # type: ignore[override]
        features = torch.relu(self.a(x))
        return (self.b(features), features) if return_features else self.b(features)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        if batch_idx % 2:
            out, features = self(x, return_features=True)
            return F.cross_entropy(out, y) + features.pow(2).mean()
        return F.cross_entropy(self(x, False), y)


class OptionalArgument(Net):
    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:  # type: ignore[override]
        features = torch.relu(self.a(x))
        if bias is not None:
            features = features + bias
        return self.b(features)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        bias = None if batch_idx % 2 else torch.full((16,), 0.1 * batch_idx)
        return F.cross_entropy(self(x, bias), y)


@pytest.mark.parametrize("model", [NumberArgument, FlagArgument, OptionalArgument])
def test_python_arguments_follow_every_call(model: type[Net]) -> None:
    eager, ort = fit_both(model, mlp_loader, STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class NumberInControlFlow(Net):
    def forward(self, x: torch.Tensor, scale: float) -> torch.Tensor:  # type: ignore[override]
        features = torch.relu(self.a(x))
        if scale > 1.0:
            features = features * 2
        return self.b(features)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x, (0.5, 3.0)[batch_idx % 2]), y)


def test_python_number_used_as_a_number_falls_back_naming_the_argument() -> None:
    with pytest.warns(UserWarning, match="PyTorch runs it"):
        eager, ort = fit_both(NumberInControlFlow, mlp_loader, STEPS, strategy=ORTStrategy(fullgraph=True))
    (report,) = ort.reports
    assert report.fallback_reason is not None
    assert "the Python number argument(s) `scale` (float)" in report.fallback_reason
    assert "Fix: make such a value a constructor argument" in report.fallback_reason
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class NumberArgumentAndMissingOperator(Net):
    """A Python number used correctly (a ``minlength``), and an operator the exporter lacks (``bincount``)."""

    def forward(self, x: torch.Tensor, classes: int) -> torch.Tensor:
        counts = torch.bincount((x[:, 0] > 0).long(), minlength=classes)
        return self.b(torch.relu(self.a(x))) * counts.float().mean()

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x, 3), y)


def test_a_missing_operator_is_the_reason_even_with_number_arguments() -> None:
    """The note on Python number arguments came first, sending users after the wrong fix."""
    eager, ort = fit_both(NumberArgumentAndMissingOperator, mlp_loader, STEPS, strategy=ORTStrategy(fullgraph=True))
    (report,) = ort.reports
    assert report.fallback_reason is not None and "aten::bincount" in report.fallback_reason
    assert "Python number argument" not in report.fallback_reason
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class NumberReadByTorch(Net):
    """``forward`` gives torch a number argument, or a tensor computed from its inputs, where torch's argument
    parser reads a Python number; the trace kept the first call's value (silently wrong before)."""

    def __init__(self, use: str) -> None:
        super().__init__()
        self.use = use
        self.register_buffer("eps", torch.tensor(0.5))

    def forward(self, x: torch.Tensor, value: float) -> torch.Tensor:  # type: ignore[override]
        h = torch.tanh(self.a(x))
        if self.use == "pad_value":
            h = F.pad(h, (0, 2), value=value)[:, 2:]
        elif self.use == "layer_norm_eps":
            h = F.layer_norm(h, (16,), eps=value)
        elif self.use == "roll":
            h = torch.roll(h, value, 1)
        elif self.use == "index_list":
            h = h * h[:, [value]]
        elif self.use == "buffer_as_eps":
            h = F.layer_norm(h, (16,), eps=self.eps * value)
        return self.b(h)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        value = (1, 3, 2)[batch_idx % 3] if self.use in ("roll", "index_list") else (0.5, 3.0, 1.5)[batch_idx % 3]
        return F.cross_entropy(self(x, value), y)


class NumpyOfActivations(Net):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import numpy as np

        h = torch.tanh(self.a(x))
        return self.b(h) * float(np.exp(-h.detach().abs().mean()))


@pytest.mark.parametrize(
    ("make", "call"),
    [
        (lambda: NumberReadByTorch("pad_value"), "gives pad a tensor"),
        (lambda: NumberReadByTorch("layer_norm_eps"), "gives layer_norm a tensor"),
        (lambda: NumberReadByTorch("roll"), "gives roll a tensor"),
        (lambda: NumberReadByTorch("index_list"), "gives __getitem__ a tensor"),
        (lambda: NumberReadByTorch("buffer_as_eps"), "gives layer_norm a tensor"),
        (NumpyOfActivations, "converts a tensor computed from its inputs to a NumPy array"),
    ],
    ids=["pad_value", "layer_norm_eps", "roll", "index_list", "buffer_as_eps", "numpy"],
)
def test_numbers_torch_reads_from_tensors_fall_back(make: type[Net], call: str) -> None:
    eager, ort = fit_both(make, mlp_loader, STEPS, strategy=ORTStrategy(fullgraph=True, fallback="warn"))
    (report,) = ort.reports
    assert report.fallback_reason is not None and call in report.fallback_reason, report.fallback_reason
    assert "the trace keeps the first call's number" in report.fallback_reason
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class NumbersUsedAsTensors(Net):
    """Number arguments torch records as tensors in the graph, and sizes of fixed dimensions: these stay in ORT."""

    def forward(self, x: torch.Tensor, value: float) -> torch.Tensor:  # type: ignore[override]
        h = torch.tanh(self.a(x))
        h = h.clamp(min=-value) + torch.full_like(h, value) * 0.1
        h = h.masked_fill(h > 0.9, value)
        h = h.clone()
        h[:, 0] = value
        h = F.pad(h, (0, h.shape[-1] - 16), value=0.0)
        return self.b(h.view(h.shape[0], -1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x, (0.5, 3.0, 1.5)[batch_idx % 3]), y)


def test_numbers_torch_records_as_tensors_stay_in_ort() -> None:
    eager, ort = fit_both(NumbersUsedAsTensors, mlp_loader, STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class BoolInArithmetic(Net):
    def __init__(self, convert: bool) -> None:
        super().__init__()
        self.convert = convert

    def forward(self, x: torch.Tensor, flag: bool) -> torch.Tensor:  # type: ignore[override]
        h = torch.tanh(self.a(x))
        return self.b(h * float(flag) + h if self.convert else h * flag + h)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x, batch_idx % 2 == 0), y)


def test_a_bool_in_tensor_arithmetic_falls_back_with_the_fix() -> None:
    eager, ort = fit_both(
        lambda: BoolInArithmetic(convert=False),
        mlp_loader,
        STEPS,
        strategy=ORTStrategy(fullgraph=True, fallback="warn"),
    )
    (report,) = ort.reports
    assert report.fallback_reason is not None and "Fix: convert it first (h * float(flag))" in report.fallback_reason
    assert_losses_match(eager, ort)
    eager, ort = fit_both(
        lambda: BoolInArithmetic(convert=True), mlp_loader, STEPS, strategy=ORTStrategy(fullgraph=True)
    )
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class TensorsOfNumbers(Net):
    """``torch.tensor`` and its kin over Python numbers: constants, also when the numbers are read from the
    module (``self.weights``, which a schedule may change at step 3: watched like any other read)."""

    def __init__(self, change: bool) -> None:
        super().__init__()
        self.change = change
        self.weights = [1.0, 2.0, 0.5]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x)) * torch.tensor(0.5) + torch.as_tensor([[1.0] * 8 + [-1.0] * 8])
        h = h.clamp(torch.tensor(-0.75), x.new_tensor(0.75)) + torch.asarray([True] * 16)
        return self.b(h) * torch.tensor(self.weights)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.change and batch_idx == 3:
            self.weights[1] = 3.0
        return super().training_step(batch, batch_idx)


def test_tensors_of_python_numbers_stay_in_ort() -> None:
    eager, ort = fit_both(lambda: TensorsOfNumbers(change=False), mlp_loader, STEPS)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
    eager, ort = fit_both(
        lambda: TensorsOfNumbers(change=True), mlp_loader, STEPS, strategy=ORTStrategy(fallback="warn")
    )
    # the change at step 3 is followed by a new export, with the new weights
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class TensorOfSizes(Net):
    """A tensor built from a list holding a size: ``torch.asarray`` kept the first batch's size silently."""

    def __init__(self, build: str) -> None:
        super().__init__()
        self.build = build

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        factory = torch.asarray if self.build == "asarray" else torch.tensor
        return self.b(torch.tanh(self.a(x))) / factory([x.shape[0], 1])[0]


@pytest.mark.parametrize("build", ["asarray", "tensor"])
def test_a_tensor_built_from_a_list_of_sizes_falls_back_naming_the_fix(build: str) -> None:
    eager, ort = fit_both(
        lambda: TensorOfSizes(build), _shrinking_batches, STEPS, strategy=ORTStrategy(fullgraph=True, fallback="warn")
    )
    (report,) = ort.reports
    reason = report.fallback_reason
    assert reason is not None and f"builds a tensor with {build} from a list holding tensors" in reason, reason
    assert "torch.stack" in reason
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def _shrinking_batches() -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(n, 16, generator=generator), torch.randint(0, 3, (n,), generator=generator)) for n in (8, 6, 4)
    ]
    return torch.utils.data.DataLoader(batches * 2, batch_size=None)


class BranchOnSizes(Net):
    """A branch on a comparison of sizes (a U-Net resizing a skip only when the sizes differ)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        if h.shape[0] != 16:
            h = h * 2
        return self.b(h)


def test_a_branch_on_sizes_is_a_guard_that_exports_again_when_it_flips() -> None:
    """Batches of 16, 16, 8: the branch holds as a guard (size_guards.py) and each flip gets a new export."""
    eager, ort = fit_both(BranchOnSizes, lambda: mlp_loader(batch_size=16, n=40), STEPS)
    (report,) = ort.reports
    assert report.fallback_reason is None and report.torch_calls == 0
    assert report.size_exports >= 1
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
