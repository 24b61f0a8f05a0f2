"""Checkpoints saved under ORT are plain Lightning checkpoints, loadable both ways, and resume correctly."""

from __future__ import annotations

from pathlib import Path

import lightning as L
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


class PickleMidFit(L.Callback):
    """Saves the whole module object (``torch.save(pl_module)``), as some users do, in the middle of fit."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: object) -> None:
        if trainer.global_step == 2:
            torch.save(pl_module, self.path)


def test_the_module_pickled_during_fit_loads_and_runs_in_pytorch(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    result = fit(CNN(), loader(), "ort", max_steps=3, callbacks=[PickleMidFit(path)])
    loaded = torch.load(path, weights_only=False)
    assert vars(loaded)["forward"].__func__ is type(loaded).forward  # its own forward, not lightning_ort's
    x = next(iter(loader()))[0]
    loaded.eval()
    result.model.eval()
    with torch.no_grad():
        assert torch.isfinite(loaded(x)).all()
    assert loaded.state_dict().keys() == result.model.state_dict().keys()
