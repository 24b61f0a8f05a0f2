"""``ORTParityCheck``: the first training steps' loss and gradients, ORT against eager PyTorch."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature
from typing_extensions import override

from lightning_ort.callbacks._ort import ORTRunStrategy, ort_bypassed, ort_strategy, owner_of
from lightning_ort.callbacks.snapshot import rng_states, side_effects_undone
from lightning_ort.errors import ORTParityError

MismatchAction = Literal["raise", "warn"]
_TINY = 1e-12


@dataclass
class ParityResult:
    """One checked training batch.

    Attributes:
        step: the optimizer step (``trainer.global_step``) the batch belongs to.
        batch_idx: the batch's index in the epoch.
        ort_loss: the loss of the step that trained (through ORT).
        eager_loss: the loss eager PyTorch computes on the same batch with the same weights.
        loss_rel_err: ``|ort_loss - eager_loss| / |eager_loss|``.
        grad_rel_err: the largest gradient difference over all parameters relative to the largest
            gradient: ``max|g_ort - g_eager| / max|g_eager|`` (near-zero gradients do not inflate it).
        worst_parameter: the parameter with the largest gradient difference.
        mismatched: parameters (and ``"loss"``) outside ``rtol``/``atol``.
    """

    step: int
    batch_idx: int
    ort_loss: float
    eager_loss: float
    loss_rel_err: float
    grad_rel_err: float
    worst_parameter: str | None
    mismatched: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether ORT matched eager PyTorch within tolerance."""
        return not self.mismatched


@dataclass
class _Pending:
    batch: Any
    batch_idx: int
    rng: dict[str, Any]
    loss: torch.Tensor | None = None
    grads_before: dict[str, torch.Tensor] = field(default_factory=dict)


def _max_abs(tensor: torch.Tensor) -> float:
    return tensor.abs().max().item() if tensor.numel() else 0.0


def _has_active_dropout(module: torch.nn.Module) -> bool:
    for layer in module.modules():
        if not layer.training:
            continue
        if isinstance(layer, torch.nn.modules.dropout._DropoutNd) and layer.p > 0:
            return True
        if isinstance(layer, torch.nn.MultiheadAttention) and layer.dropout > 0:
            return True
    return False


def _step_loss(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict):
        return output.get("loss")
    return None


class ORTParityCheck(Callback):
    """Check ORT against eager PyTorch on the first training steps, without changing the training.

    For each of the first ``steps`` training batches, after ORT's forward and backward, the
    LightningModule's ``training_step`` runs again on the same batch and the same weights with ORT
    bypassed (plain PyTorch, same random numbers), and the loss and every parameter's gradient are
    compared. Weights, buffers (BatchNorm statistics), torchmetrics states and random states are
    restored afterwards, the optimizer is never stepped by the check, and ``self.log`` calls in the
    repeated step are ignored, so the run trains exactly as without the callback.

    The relative errors are logged as ``ort_parity/loss_rel_err`` and ``ort_parity/grad_rel_err``
    to the Trainer's loggers (at each checked step) and ``trainer.callback_metrics``, and kept in
    :attr:`results`.

    Args:
        steps: how many of the first training batches to check.
        rtol: relative tolerance, as in :func:`torch.allclose`.
        atol: absolute tolerance, as in :func:`torch.allclose`.
        on_mismatch: ``"raise"`` stops training with :class:`~lightning_ort.ORTParityError`;
            ``"warn"`` warns and trains on.

    Models with active dropout inside ORT are not compared (ORT draws its own dropout masks); the
    callback warns once and skips them. Manual optimization is not supported. During a check the
    callback holds a copy of the weights, buffers and gradients.
    """

    def __init__(
        self, steps: int = 3, rtol: float = 1e-4, atol: float = 1e-6, on_mismatch: MismatchAction = "raise"
    ) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"ORTParityCheck(steps={steps!r}) must be a positive int, e.g. steps=3.")
        for name, value in (("rtol", rtol), ("atol", atol)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
                raise ValueError(f"ORTParityCheck({name}={value!r}) must be a finite float >= 0, e.g. {name}=1e-4.")
        if on_mismatch not in ("raise", "warn"):
            raise ValueError(f"ORTParityCheck(on_mismatch={on_mismatch!r}) must be 'raise' or 'warn'.")
        self.steps = steps
        self.rtol = float(rtol)
        self.atol = float(atol)
        self.on_mismatch: MismatchAction = on_mismatch
        self.results: list[ParityResult] = []
        self._strategy: ORTRunStrategy | None = None
        self._pending: _Pending | None = None
        self._checked = 0
        self._dropout_warned = False

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._strategy = ort_strategy(trainer, "ORTParityCheck")
        self._checked = 0
        self._pending = None
        self.results = []
        if self._strategy is not None and not pl_module.automatic_optimization:
            raise ValueError(
                "ORTParityCheck needs automatic optimization: with manual optimization training_step steps the "
                "optimizer itself, so it cannot be repeated without changing the training. Fix: remove the callback."
            )

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._strategy is None or self._checked >= self.steps:
            self._pending = None
            return
        self._pending = _Pending(batch, batch_idx, rng_states())

    @override
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        if self._pending is None:
            return
        self._pending.loss = loss.detach().clone()
        # With gradient accumulation, earlier batches' gradients are already there.
        self._pending.grads_before = {
            name: parameter.grad.detach().clone()
            for name, parameter in pl_module.named_parameters()
            if parameter.grad is not None
        }

    @override
    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        pending, self._pending = self._pending, None
        if pending is None or pending.loss is None or self._strategy is None:
            return
        self._checked += 1
        owners = [owner_of(pl_module, name) for name in self._strategy.ort_modules]
        if any(_has_active_dropout(owner) for owner in owners):
            if not self._dropout_warned:
                self._dropout_warned = True
                rank_zero_warn(
                    "lightning_ort: ORTParityCheck skips this model: dropout is active inside ORT, which draws its own "
                    "masks, so ORT and eager PyTorch differ by design. Fix: check with dropout set to 0."
                )
            return
        result = self._compare(trainer, pl_module, pending)
        self.results.append(result)
        metrics = {"ort_parity/loss_rel_err": result.loss_rel_err, "ort_parity/grad_rel_err": result.grad_rel_err}
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, logger=False)
        # Straight to the loggers: through self.log they would only see the steps of `log_every_n_steps`.
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        if not result.ok:
            self._mismatch(result)

    def _compare(self, trainer: pl.Trainer, pl_module: pl.LightningModule, pending: _Pending) -> ParityResult:
        assert pending.loss is not None
        parameters = [(name, p) for name, p in pl_module.named_parameters() if p.requires_grad]
        ort_grads = {}
        for name, parameter in parameters:
            grad = torch.zeros_like(parameter) if parameter.grad is None else parameter.grad.detach()
            before = pending.grads_before.get(name)
            ort_grads[name] = grad if before is None else grad - before
        args: list[Any] = [pending.batch]
        if is_param_in_hook_signature(pl_module.training_step, "batch_idx", min_args=2):
            args.append(pending.batch_idx)
        with (
            side_effects_undone(pl_module, replay_rng=pending.rng),
            ort_bypassed(pl_module),
            torch.enable_grad(),
            trainer.precision_plugin.train_step_context(),
        ):
            loss = _step_loss(pl_module.training_step(*args))
            if loss is None:
                raise ORTParityError(
                    "ORTParityCheck: training_step returned no loss when repeated in eager PyTorch; "
                    "it must return the same kind of output on the same batch."
                )
            loss = loss / trainer.accumulate_grad_batches
            grads = torch.autograd.grad(loss, [p for _, p in parameters], allow_unused=True)
        eager_loss = loss.detach()
        mismatched = []
        if not torch.allclose(pending.loss, eager_loss, rtol=self.rtol, atol=self.atol):
            mismatched.append("loss")
        worst, worst_difference, largest = None, 0.0, 0.0
        for (name, parameter), grad in zip(parameters, grads, strict=True):
            eager = torch.zeros_like(parameter) if grad is None else grad.detach()
            difference = _max_abs(ort_grads[name] - eager)
            largest = max(largest, _max_abs(eager))
            if worst is None or difference > worst_difference:
                worst, worst_difference = name, difference
            if not torch.allclose(ort_grads[name], eager, rtol=self.rtol, atol=self.atol):
                mismatched.append(name)
        return ParityResult(
            step=trainer.global_step,
            batch_idx=pending.batch_idx,
            ort_loss=pending.loss.item(),
            eager_loss=eager_loss.item(),
            loss_rel_err=_max_abs(pending.loss - eager_loss) / max(_max_abs(eager_loss), _TINY),
            grad_rel_err=worst_difference / max(largest, _TINY),
            worst_parameter=worst,
            mismatched=mismatched,
        )

    def _mismatch(self, result: ParityResult) -> None:
        shown = ", ".join(result.mismatched[:5]) + (", ..." if len(result.mismatched) > 5 else "")
        message = (
            f"ORTParityCheck: at step {result.step} (batch {result.batch_idx}) ORT and eager PyTorch differ beyond "
            f"rtol={self.rtol:g}, atol={self.atol:g} in {shown}: loss {result.ort_loss:.6g} (ORT) vs "
            f"{result.eager_loss:.6g} (eager), relative error {result.loss_rel_err:.3g}; gradient relative error "
            f"{result.grad_rel_err:.3g}, largest in {result.worst_parameter}. The module trains differently in ORT: "
            "check for code that behaves differently under torch.onnx export/tracing, or keep it out of ORT with "
            "ORTStrategy(modules=[...])."
        )
        if self.on_mismatch == "raise":
            raise ORTParityError(message)
        rank_zero_warn(message)
