"""The ``lightning-ort`` command (a LightningCLI with lightning_ort imported) and the example configs."""

from __future__ import annotations

import csv
import difflib
import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningCLI

from lightning_ort import ORTDDPStrategy, ORTStrategy
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
    callbacks = [callback for callback in cli.trainer.callbacks if not isinstance(callback, ProgressBar)]
    assert [type(callback) for callback in callbacks] == [RunSummary]  # the examples' configs show a progress bar


FALLBACK_RAISE = "--trainer.strategy.fallback=raise"
INIT_ARGS_RAISE = "--trainer.strategy.init_args.fallback=raise"
CLASS_PATH = "--trainer.strategy.class_path=lightning_ort.ORTStrategy"
STRATEGY_OVERRIDES = {
    "option": [FALLBACK_RAISE],
    "init_args-option": [INIT_ARGS_RAISE],
    "name-then-init_args": ["--trainer.strategy=ort", INIT_ARGS_RAISE],
    "name-then-options": ["--trainer.strategy=ORT", FALLBACK_RAISE, "--trainer.strategy.log_level=info"],
    "class_path-then-init_args": [CLASS_PATH, INIT_ARGS_RAISE],
    "class_path-then-option": [CLASS_PATH, FALLBACK_RAISE],
}


# The ORT config with each override; the eager one (`strategy: auto`) with those that name the strategy first.
OVERRIDE_CASES = [
    pytest.param(flavour, override, id=f"{flavour}-{name}")
    for flavour in ("ort", "eager")
    for name, override in STRATEGY_OVERRIDES.items()
    if flavour == "ort" or override[0].startswith(("--trainer.strategy=", CLASS_PATH))
]


@pytest.mark.parametrize(("flavour", "override"), OVERRIDE_CASES)
def test_strategy_options_override_a_strategy_given_by_name(override: list[str], flavour: str, repo: Path) -> None:
    """`strategy: ort` in a config, then `--trainer.strategy.fallback=raise` (or `.init_args.fallback`)."""
    args = ["--config", config("cnn_digits", flavour), "--trainer.logger=false", *override]
    cli = ORTLightningCLI(args=args, run=False, save_config_callback=None)
    assert type(cli.trainer.strategy) is ORTStrategy and cli.trainer.strategy.fallback == "raise"
    assert cli.trainer.strategy.log_level == ("INFO" if "--trainer.strategy.log_level=info" in override else "WARNING")


def test_a_second_config_sets_options_of_the_strategy_named_in_the_first(repo: Path) -> None:
    for number, strategy in enumerate([{"init_args": {"fallback": "raise"}}, {"fallback": "raise"}]):
        path = repo / f"override{number}.yaml"
        path.write_text(yaml.safe_dump({"trainer": {"strategy": strategy}}))
        args = ["--config", config("cnn_digits", "ort"), "--config", str(path), "--trainer.logger=false"]
        cli = ORTLightningCLI(args=args, run=False, save_config_callback=None)
        assert type(cli.trainer.strategy) is ORTStrategy and cli.trainer.strategy.fallback == "raise", strategy


def test_a_registered_ddp_name_keeps_its_start_method(repo: Path, capfd: pytest.CaptureFixture[str]) -> None:
    args = ["--config", config("cnn_digits", "ort"), "--trainer.strategy=ort_ddp_spawn", FALLBACK_RAISE]
    strategy = yaml.safe_load(print_config(args, capfd))["trainer"]["strategy"]
    assert strategy["class_path"] == "lightning_ort.ORTDDPStrategy"
    assert strategy["init_args"]["start_method"] == "spawn" and strategy["init_args"]["fallback"] == "raise"
    assert "start_method" in inspect.signature(ORTDDPStrategy).parameters


@pytest.mark.parametrize(
    "override",
    [[CLASS_PATH, INIT_ARGS_RAISE], ["--trainer.strategy=ORTStrategy", FALLBACK_RAISE]],
    ids=["class_path", "class-name"],
)
def test_a_plain_lightning_cli_takes_the_class_forms(override: list[str], repo: Path) -> None:
    """jsonargparse knows ORTStrategy as a subclass of Strategy, so a plain LightningCLI (with lightning_ort
    imported) takes these; a registered name followed by an option needs ORTLightningCLI."""
    args = ["--config", config("cnn_digits", "ort"), "--trainer.logger=false", *override]
    cli = LightningCLI(args=args, run=False, save_config_callback=None)
    assert type(cli.trainer.strategy) is ORTStrategy and cli.trainer.strategy.fallback == "raise"


def test_fit_help_says_how_to_set_and_list_the_ort_options(repo: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    help_text = " ".join(capfd.readouterr().out.split())
    assert "`--trainer.strategy.fallback=raise`" in help_text and "`--trainer.strategy.help ORTStrategy`" in help_text
    for name in ("ORTStrategy", "ort"):
        with pytest.raises(SystemExit):
            main(["fit", "--trainer.strategy.help", name])
        out = capfd.readouterr().out
        assert "--trainer.strategy.fallback {warn,raise}" in out and "--trainer.strategy.export_cache" in out, name


TINY = """
import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def forward(self, x):
        h = self.layer(x)
        if h.sum() > 0:  # control flow on computed data: ORT cannot export it, so fallback=raise stops the run
            h = -h
        return h

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class TinyData(L.LightningDataModule):
    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(16, 4, generator=generator), torch.randint(0, 2, (16,), generator=generator))
        return DataLoader(data, batch_size=4)
"""
TINY_CONFIG = {
    "trainer": {
        "accelerator": "cpu",
        "devices": 1,
        "strategy": "ort",
        "max_steps": 2,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    },
    "model": {"class_path": "tiny.Tiny"},
    "data": {"class_path": "tiny.TinyData"},
}


@pytest.mark.parametrize(
    "override",
    [[], *(STRATEGY_OVERRIDES[key] for key in ("option", "name-then-init_args", "class_path-then-init_args"))],
    ids=["none", "option", "name-then-init_args", "class_path-then-init_args"],
)
def test_the_command_applies_strategy_options_to_a_config_with_strategy_ort(
    override: list[str], tmp_path: Path
) -> None:
    """`lightning-ort fit --config tiny.yaml --trainer.strategy.fallback=raise` with `strategy: ort` in tiny.yaml:
    a model ORT cannot export trains in PyTorch after a warning, or stops with the option."""
    (tmp_path / "tiny.py").write_text(TINY)
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY_CONFIG))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "lightning_ort", "fit", "--config", "tiny.yaml", *override],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Does not validate" not in result.stderr, result.stderr[-3000:]
    if not override:
        assert result.returncode == 0, result.stderr[-3000:]
        line = 1 + next(number for number, text in enumerate(TINY.splitlines()) if "self(x)" in text)
        assert f"{tmp_path / 'tiny.py'}:{line}: UserWarning: lightning_ort: ORT cannot run `forward`" in result.stderr
        assert "ORT ran `forward`: 0 calls in ORT, 2 in PyTorch; gave up on its training graph" in result.stdout
    else:
        assert result.returncode == 1, result.stderr[-3000:]
        assert "ORTFallbackError: ORT cannot run `forward` (Tiny) in its training graph" in result.stderr


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
    assert "log_level" in err and "Expected a typing.Literal['VERBOSE', 'DEBUG', 'INFO', 'WARNING'," in err


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
