"""Checkpoints saved under ORT are plain Lightning checkpoints, loadable both ways, and resume correctly."""

from __future__ import annotations

from pathlib import Path

import torch
from helpers import assert_losses_match, assert_states_match, fit
from models import CNN, image_loader

from lightning_ort import ORTStrategy


def loader() -> torch.utils.data.DataLoader:
    return image_loader(batch_size=16, n=160)  # 10 batches per epoch


def train_epochs(strategy: object, epochs: int, ckpt_path: Path | None = None, save_to: Path | None = None):
    torch.manual_seed(0)
    result = fit(CNN(), loader(), strategy, max_steps=-1, max_epochs=epochs, ckpt_path=ckpt_path)
    if save_to is not None:
        result.trainer.save_checkpoint(save_to)
    return result


def test_checkpoint_has_the_keys_of_an_eager_run(tmp_path: Path) -> None:
    train_epochs("auto", 1, save_to=tmp_path / "eager.ckpt")
    ort = train_epochs("ort", 1, save_to=tmp_path / "ort.ckpt")
    assert ort.reports[0].ort_calls == 10
    eager_ckpt = torch.load(tmp_path / "eager.ckpt", weights_only=False)
    ort_ckpt = torch.load(tmp_path / "ort.ckpt", weights_only=False)
    assert eager_ckpt.keys() == ort_ckpt.keys()
    assert eager_ckpt["state_dict"].keys() == ort_ckpt["state_dict"].keys()
    assert eager_ckpt["global_step"] == ort_ckpt["global_step"] == 10
    assert len(ort_ckpt["optimizer_states"][0]["state"]) == len(eager_ckpt["optimizer_states"][0]["state"])
    # a plain LightningModule loads it without lightning_ort
    restored = CNN.load_from_checkpoint(tmp_path / "ort.ckpt")
    for key, value in ort_ckpt["state_dict"].items():
        torch.testing.assert_close(restored.state_dict()[key], value, rtol=0, atol=0)


def test_resume_both_ways_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    uninterrupted = train_epochs("auto", 2)
    # ORT checkpoint resumed by a plain Trainer
    train_epochs(ORTStrategy(), 1, save_to=tmp_path / "ort.ckpt")
    plain = train_epochs("auto", 2, ckpt_path=tmp_path / "ort.ckpt")
    # eager checkpoint resumed under ORT
    train_epochs("auto", 1, save_to=tmp_path / "eager.ckpt")
    ort = train_epochs("ort", 2, ckpt_path=tmp_path / "eager.ckpt")
    assert ort.trainer.global_step == plain.trainer.global_step == 20
    assert ort.reports[0].ort_calls == 10 and ort.reports[0].fallback_reason is None
    for resumed in (plain, ort):
        assert_losses_match(uninterrupted.after(10), resumed)
        assert_states_match(uninterrupted, resumed)
