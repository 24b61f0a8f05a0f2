"""fused_optimizer=True: torch's fused AdamW on CPU, same updates as torch AdamW, state survives resume."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import pytest
import torch
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit, fit_both
from models import MLP, mlp_loader

from lightning_ort import ORTStrategy
from lightning_ort.optim import fuse_optimizer


class AdamWMLP(MLP):
    def configure_optimizers(self) -> dict:
        optimizer = torch.optim.AdamW(
            [
                {"params": self.body.parameters(), "weight_decay": 0.1},
                {"params": self.head.parameters(), "weight_decay": 0.0, "lr": 3e-3},
            ],
            lr=1e-2,
            betas=(0.8, 0.95),
        )
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def test_fuse_optimizer_matches_torch_adamw_updates() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    twin = copy.deepcopy(model)
    plain = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    fused = fuse_optimizer(torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.1))
    assert fused.param_groups[0]["fused"] is True
    for _ in range(10):
        x = torch.randn(16, 8)
        for net, optimizer in ((model, plain), (twin, fused)):
            net(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)


def test_strategy_fuses_adamw_keeping_groups_and_scheduler() -> None:
    eager, ort = fit_both(AdamWMLP, mlp_loader, 12, strategy=ORTStrategy(fused_optimizer=True))
    assert_ort_ran(ort, 12)
    (optimizer,) = ort.trainer.optimizers
    assert [group["fused"] for group in optimizer.param_groups] == [True, True]
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.1, 0.0]
    # StepLR halved both groups' learning rates three times
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([1e-2 / 8, 3e-3 / 8])
    assert ort.trainer.lr_scheduler_configs[0].scheduler.optimizer is optimizer
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_fused_optimizer_state_survives_resume(tmp_path: Path) -> None:
    def run(epochs: int, ckpt_path: Path | None = None):  # noqa: ANN202
        torch.manual_seed(0)
        strategy = ORTStrategy(fused_optimizer=True)
        loader = mlp_loader(n=96)  # 6 batches per epoch
        return fit(AdamWMLP(), loader, strategy, max_steps=-1, max_epochs=epochs, ckpt_path=ckpt_path)

    uninterrupted = run(2)
    run(1).trainer.save_checkpoint(tmp_path / "half.ckpt")
    state = torch.load(tmp_path / "half.ckpt", weights_only=False)["optimizer_states"][0]
    assert state["state"] and all("exp_avg_sq" in s for s in state["state"].values())
    # saved as configure_optimizers made the groups: a plain Trainer resumes the user's AdamW, not the fused one
    assert [(group["fused"], group["foreach"]) for group in state["param_groups"]] == [(None, None)] * 2
    resumed = run(2, tmp_path / "half.ckpt")
    assert resumed.trainer.global_step == 12
    assert [group["fused"] for group in resumed.trainer.optimizers[0].param_groups] == [True, True]
    assert_losses_match(uninterrupted.after(6), resumed)
    assert_states_match(uninterrupted, resumed)


def test_a_checkpoint_without_fusion_resumes_fused(tmp_path: Path) -> None:
    """Lightning loads the optimizer's state after the strategy fused it, and ``load_state_dict`` takes the
    checkpoint's group flags: resumed from an eager checkpoint, the optimizer ran unfused."""
    fit(AdamWMLP(), mlp_loader(n=96), "auto", max_steps=3).trainer.save_checkpoint(tmp_path / "eager.ckpt")
    resumed = fit(AdamWMLP(), mlp_loader(n=96), ORTStrategy(fused_optimizer=True), 6, ckpt_path=tmp_path / "eager.ckpt")
    assert resumed.trainer.global_step == 6
    assert [group["fused"] for group in resumed.trainer.optimizers[0].param_groups] == [True, True]


def test_other_optimizers_are_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="lightning_ort"):
        result = fit(MLP(), mlp_loader(), ORTStrategy(fused_optimizer=True), max_steps=2)
    assert type(result.trainer.optimizers[0]) is torch.optim.SGD
    assert "fused_optimizer leaves SGD unchanged" in caplog.text
