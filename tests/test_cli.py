"""The ``lightning-ort`` command (a LightningCLI with lightning_ort imported) and the example configs."""

from __future__ import annotations

import csv
import difflib
import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from lightning_ort import ORTStrategy
from lightning_ort.__main__ import main as command
from lightning_ort.cli import ORTLightningCLI, RunSummary, main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("gpt", "encoder_classifier", "cnn_digits")
# A few steps, two validation batches after them, nothing written into the repository.
SHORT = ["--trainer.max_steps=3", "--trainer.val_check_interval=3", "--trainer.limit_val_batches=2"]
STRATEGY_OPTIONS = [name for name in inspect.signature(ORTStrategy).parameters]


def config(example: str, flavour: str) -> str:
    return f"examples/{example}/configs/{flavour}.yaml"


@pytest.fixture
def repo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Run as `lightning-ort ...` from the repository root would (class paths like examples.gpt.model.GPT)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.setattr(sys, "argv", ["lightning-ort"])  # the arguments come from `args`, not pytest's
    return tmp_path


def print_config(args: list[str], capfd: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(["fit", *args, "--print_config"])
    assert exited.value.code in (0, None)
    return capfd.readouterr().out


@pytest.mark.parametrize("example", EXAMPLES)
def test_eager_and_ort_configs_differ_in_the_strategy_line_only(example: str) -> None:
    eager, ort = ((ROOT / config(example, flavour)).read_text().splitlines() for flavour in ("eager", "ort"))
    changed = [line for line in difflib.unified_diff(eager, ort, lineterm="", n=0) if line[:1] in "+-"]
    assert changed[2:] == ["-  strategy: auto", "+  strategy: ort"]


@pytest.mark.parametrize("flavour", ["eager", "ort"])
@pytest.mark.parametrize("example", EXAMPLES)
def test_example_config_fits(example: str, flavour: str, repo: Path, capfd: pytest.CaptureFixture[str]) -> None:
    args = ["fit", "--config", config(example, flavour), *SHORT]
    cli = main([*args, "--trainer.logger=false", f"--trainer.default_root_dir={repo}"])
    out = capfd.readouterr().out
    assert cli.trainer.global_step == 3
    summary = out[out.index("lightning-ort fit summary") :]
    assert "training: 3 steps, first " in summary and " steps/s (steps 2-3: median " in summary
    metrics = summary.split("final metrics: ")[1].splitlines()[0]
    assert "train_loss=" in metrics and "val_loss=" in metrics
    if example != "gpt":
        assert "val_acc=" in metrics and "val_f1=" in metrics
    if flavour == "eager":
        assert not isinstance(cli.trainer.strategy, ORTStrategy) and "ORT ran" not in summary
    else:
        assert isinstance(cli.trainer.strategy, ORTStrategy)
        (report,) = cli.trainer.strategy.ort_reports
        assert report.uses_ort and report.torch_calls == 0 and report.ort_calls == 5  # 3 training + 2 validation
        assert "ORT ran `forward`: 5 calls in ORT, 0 in PyTorch" in summary


@pytest.mark.parametrize(
    "strategy",
    [
        ["--trainer.strategy=ort"],
        ["--trainer.strategy.class_path=lightning_ort.ORTStrategy", "--trainer.strategy.init_args.fallback=raise"],
        ["--trainer.strategy=lightning_ort.ORTStrategy"],  # a plain string to LightningCLI (Lightning issue 19682)
        ["--trainer.strategy", "{class_path: lightning_ort.ORTStrategy, init_args: {fallback: raise}}"],
    ],
    ids=["registered-name", "class_path-flag", "dotted-string", "class_path-yaml"],
)
def test_every_strategy_form_gives_an_ort_strategy(strategy: list[str], repo: Path) -> None:
    args = ["--config", config("cnn_digits", "eager"), "--trainer.logger=false", *strategy]
    cli = ORTLightningCLI(args=args, run=False, save_config_callback=None)
    assert type(cli.trainer.strategy) is ORTStrategy
    assert cli.trainer.strategy.fallback == ("raise" if "raise" in " ".join(strategy) else "warn")
    assert [type(callback) for callback in cli.trainer.callbacks] == [RunSummary]


def test_strategy_options_from_yaml_are_typed_and_shown_in_full(repo: Path, capfd: pytest.CaptureFixture[str]) -> None:
    options = {"modules": ["features"], "log_level": "ERROR", "intra_op_num_threads": 1, "allow_spinning": True}
    strategy = {"trainer": {"strategy": {"class_path": "lightning_ort.ORTStrategy", "init_args": options}}}
    path = repo / "strategy.yaml"
    path.write_text(yaml.safe_dump(strategy))
    printed = yaml.safe_load(print_config(["--config", config("cnn_digits", "eager"), "--config", str(path)], capfd))
    init_args = printed["trainer"]["strategy"]["init_args"]
    assert list(init_args) == STRATEGY_OPTIONS  # every option, in the signature's order
    assert {name: init_args[name] for name in options} == options
    cli = ORTLightningCLI(args=["--config", config("cnn_digits", "eager"), "--config", str(path)], run=False)
    assert cli.trainer.strategy.modules == ["features"] and cli.trainer.strategy.runtime_options.allow_spinning


def test_a_bad_strategy_option_is_rejected_by_the_parser(repo: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(
            [
                "fit",
                "--config",
                config("cnn_digits", "eager"),
                "--trainer.strategy.class_path=lightning_ort.ORTStrategy",
                "--trainer.strategy.init_args.log_level=LOUD",
            ]
        )
    assert exited.value.code == 2
    err = capfd.readouterr().err
    assert "log_level" in err and "Expected a typing.Literal['VERBOSE', 'INFO', 'WARNING', 'ERROR', 'FATAL']" in err


@pytest.mark.parametrize(
    "args",
    [
        ["--config", config("gpt", "ort")],
        ["--config", config("encoder_classifier", "ort")],
        ["--config", config("cnn_digits", "ort")],
        [
            "--config",
            config("cnn_digits", "eager"),
            "--trainer.strategy.class_path=lightning_ort.ORTStrategy",
            "--trainer.strategy.init_args.log_level=INFO",
            "--trainer.strategy.init_args.modules=[features, classifier]",
        ],
        [
            "--model=examples.cnn_digits.model.DigitsCNN",
            "--data=examples.cnn_digits.model.DigitsDataModule",
            "--trainer.strategy=ort",
        ],
    ],
    ids=["gpt", "encoder_classifier", "cnn_digits", "class_path-strategy", "model-and-data-flags"],
)
def test_print_config_round_trips(args: list[str], repo: Path, capfd: pytest.CaptureFixture[str]) -> None:
    first = print_config(args, capfd)
    path = repo / "printed.yaml"
    path.write_text(first)
    assert print_config(["--config", str(path)], capfd) == first
    printed: dict[str, Any] = yaml.safe_load(first)
    strategy = printed["trainer"]["strategy"]
    if isinstance(strategy, dict):
        assert strategy["class_path"] == "lightning_ort.ORTStrategy" and list(strategy["init_args"]) == STRATEGY_OPTIONS
    else:
        assert strategy == "ort"
    assert printed["model"]["class_path"].startswith("examples.")


def test_help_names_the_setup_subcommand(repo: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        command(["--help"])
    out = capfd.readouterr().out
    assert "{fit,validate,test,predict}" in out and "lightning-ort setup [--verbose]" in out
    with pytest.raises(SystemExit):
        command(["setup", "--help"])
    assert "usage: lightning-ort setup [-h] [--verbose]" in capfd.readouterr().out


def test_console_entry_point_trains_with_the_plain_string(tmp_path: Path) -> None:
    """`lightning-ort fit --config ...` with `strategy: ort` and no user code importing lightning_ort."""
    script = Path(sys.executable).with_name("lightning-ort")
    assert script.exists(), f"{script} is missing: install the package (pip install -e .) to get the entry point"
    assert "strategy: ort\n" in (ROOT / config("cnn_digits", "ort")).read_text()
    result = subprocess.run(
        [
            str(script),
            "fit",
            "--config",
            config("cnn_digits", "ort"),
            "--trainer.max_steps=2",
            "--trainer.limit_val_batches=0",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "lightning-ort fit summary (strategy: ORTStrategy)" in result.stdout
    assert "ORT ran `forward`: 2 calls in ORT, 0 in PyTorch" in result.stdout
    (metrics_file,) = tmp_path.glob("lightning_logs/version_0/metrics.csv")
    rows = list(csv.DictReader(metrics_file.open()))
    assert [row["steps_per_sec"] for row in rows if row.get("steps_per_sec")], "steps/s was not logged"
    assert (metrics_file.parent / "config.yaml").exists()  # LightningCLI saved the config of the run
