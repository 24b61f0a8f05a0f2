"""examples/hf_causal_lm: its configs train a few steps eagerly and under strategy: ort, reporting what ORT ran."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lightning_ort import ORTStrategy
from lightning_ort.cli import main

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "examples/hf_causal_lm/configs/{}.yaml"
SHORT = ["--trainer.max_steps=3", "--trainer.val_check_interval=3", "--trainer.limit_val_batches=2"]


@pytest.fixture
def repo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.setattr(sys, "argv", ["lightning-ort"])
    return tmp_path


def fit(flavour: str, root: Path, capfd: pytest.CaptureFixture[str]) -> tuple[object, str]:
    args = ["fit", "--config", CONFIG.format(flavour), *SHORT, "--trainer.logger=false"]
    cli = main([*args, f"--trainer.default_root_dir={root}"])
    out = capfd.readouterr().out
    return cli, out[out.index("lightning-ort fit summary") :]


def test_eager_and_ort_configs_train_to_the_same_losses(repo: Path, capfd: pytest.CaptureFixture[str]) -> None:
    eager, eager_summary = fit("eager", repo / "eager", capfd)
    ort, ort_summary = fit("ort", repo / "ort", capfd)
    for cli in (eager, ort):
        assert cli.trainer.global_step == 3  # type: ignore[attr-defined]
    metrics = [dict(cli.trainer.callback_metrics) for cli in (eager, ort)]  # type: ignore[attr-defined]
    for name in ("train_loss", "val_loss"):
        assert abs(float(metrics[0][name]) - float(metrics[1][name])) <= 1e-5 * float(metrics[0][name]), name
    strategy = ort.trainer.strategy  # type: ignore[attr-defined]
    assert isinstance(strategy, ORTStrategy) and strategy.ort_reports
    for report in strategy.ort_reports:  # each module ORT ran took calls; each it gave up on says why
        assert report.ort_calls > 0 or report.fallback_reason, report
        assert f"ORT ran `{report.name}`" in ort_summary
    assert "ORT ran" not in eager_summary


def test_the_tokenizer_round_trips_and_names_unknown_characters() -> None:
    sys.path.insert(0, str(ROOT))
    from examples.hf_causal_lm.model import CharTokenizer

    tokenizer = CharTokenizer("to be or not")
    assert tokenizer.decode(tokenizer.encode("not to be")) == "not to be" and tokenizer.vocab_size == 7
    with pytest.raises(ValueError, match=r"\['z'\] are not in the vocabulary"):
        tokenizer.encode("z")
