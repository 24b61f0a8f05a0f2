"""What a user sees from a plain ``Trainer(strategy="ort")``: the end-of-fit summary, warnings that name the
user's line, log levels in either case, and every import path the docs show."""

from __future__ import annotations

import importlib
import inspect
import logging
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import assert_ort_ran, fit
from models import MLP, DataDependent, mlp_loader

from lightning_ort import ORTStrategy, engine
from lightning_ort.cli import RunSummary
from lightning_ort.ddp import ORTDDPStrategy

ROOT = Path(__file__).resolve().parents[1]


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def lightning_log() -> Iterator[Records]:
    """The messages Lightning logs to the console (``rank_zero_info``), whether or not they reach the root logger."""
    logger, records = logging.getLogger("lightning.pytorch"), Records()
    logger.addHandler(records)
    try:
        yield records
    finally:
        logger.removeHandler(records)


def summaries(records: Records) -> list[str]:
    return [message for message in records.messages if "lightning_ort: fit summary" in message]


def test_a_fit_ends_with_one_summary_of_what_ran_in_ort(lightning_log: Records) -> None:
    result = fit(MLP(), mlp_loader(), ORTStrategy(log_level="error"), max_steps=8)
    assert_ort_ran(result, 8)
    (report,) = result.reports
    (summary,) = summaries(lightning_log)
    lines = summary.splitlines()
    assert lines[0] == "lightning_ort: fit summary (ORTStrategy)"
    assert re.fullmatch(
        r"  8 training steps in \d+\.\d s, the first \d+\.\d{3} s, then \d+\.\d\d steps/s \(median of steps 6-7\)",
        lines[1],
    ), lines[1]
    assert lines[2] == (
        f"  ORT ran `forward`: {report.ort_calls} calls in ORT, 0 in PyTorch (first ORT call "
        f"{report.first_call_seconds:.2f} s, export included); mode='auto': too short a run to time ORT against PyTorch"
    )
    assert report.ort_calls == 8
    # validate (or test) after the fit says nothing more
    result.trainer.validate(result.model, mlp_loader(n=32), verbose=False)
    assert len(summaries(lightning_log)) == 1


def test_the_summary_gives_the_fallback_reason(lightning_log: Records) -> None:
    with pytest.warns(UserWarning, match="ORT cannot run"):
        fit(DataDependent(), mlp_loader(), "ort", max_steps=3)
    (summary,) = summaries(lightning_log)
    assert "  ORT ran `forward`: 0 calls in ORT, 3 in PyTorch; gave up on its training graph: " in summary
    assert "control flow or values that depend on tensor data" in summary
    # the graph break: its submodules ran in ORT, and the summary gives their share of the parameters
    assert "; ORT runs its 2 submodule(s) instead" in summary
    assert "  ORT trains 100% of the trainable parameters, in 2 module graph(s)" in summary
    assert "  ORT ran `body`: 3 calls in ORT, 0 in PyTorch" in summary


def test_a_run_summary_callback_replaces_the_strategys_summary(
    lightning_log: Records, capfd: pytest.CaptureFixture[str]
) -> None:
    fit(MLP(), mlp_loader(), "ort", max_steps=3, callbacks=[RunSummary()])
    assert summaries(lightning_log) == []
    assert "ORT ran `forward`: 3 calls in ORT, 0 in PyTorch" in capfd.readouterr().out


def test_the_fallback_warning_names_the_users_line() -> None:
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        fit(DataDependent(), mlp_loader(), "ort", max_steps=2)
    (record,) = [record for record in records if "ORT cannot run" in str(record.message)]
    source, first = inspect.getsourcelines(MLP.training_step)  # DataDependent inherits it: `self(x)` is there
    line = first + next(number for number, text in enumerate(source) if "self(x)" in text)
    assert (Path(record.filename), record.lineno) == (Path(inspect.getfile(MLP)), line)


@pytest.mark.parametrize(
    ("given", "ort_level"),
    [
        ("VERBOSE", "VERBOSE"),
        ("verbose", "VERBOSE"),
        ("debug", "VERBOSE"),
        ("DEBUG", "VERBOSE"),
        ("info", "INFO"),
        ("Warning", "WARNING"),
        ("error", "ERROR"),
        ("fatal", "FATAL"),
        ("critical", "FATAL"),
    ],
)
@pytest.mark.parametrize("strategy_class", [ORTStrategy, ORTDDPStrategy])
def test_log_levels_in_either_case_and_pythons_names(strategy_class: type, given: str, ort_level: str) -> None:
    strategy = strategy_class(log_level=given)
    assert strategy.log_level == ort_level and strategy.runtime_options.log_level == ort_level
    assert engine.python_level(ort_level) == logging.getLevelName(
        {"VERBOSE": "DEBUG", "FATAL": "CRITICAL"}.get(ort_level, ort_level)
    )


def test_an_unknown_log_level_names_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match=r"log_level='loud'\) is not one of VERBOSE, INFO, WARNING, ERROR, FATAL or"):
        ORTStrategy(log_level="loud")


def _documented_imports() -> list[str]:
    """Every ``from lightning_ort... import ...`` and dotted ``lightning_ort.X`` name in the README, the docs
    and the examples, as ``module:name`` or a dotted path (logger names, e.g. ``lightning_ort.ort``, left out)."""
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").rglob("*.md"))]
    texts += sorted((ROOT / "examples").rglob("*.py"))
    found = set()
    for path in texts:
        text = path.read_text()
        for module, grouped, names in re.findall(r"from (lightning_ort[\w.]*) import (?:\(([^)]*)\)|([\w, ]+))", text):
            for name in (grouped or names).split(","):
                name = name.split("#")[0].split(" as ")[0].strip()
                if name:
                    found.add(f"{module}:{name}")
        found.update(re.findall(r"\blightning_ort(?:\.\w+)+", text))
    loggers = {engine.PYTHON_LOGGER, engine.NATIVE_LOGGER}
    return sorted(name for name in found if name not in loggers)


def _resolve(reference: str) -> object:
    if ":" in reference:
        module, name = reference.split(":")
        return getattr(importlib.import_module(module), name)
    parts = reference.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for name in parts[split:]:
            target = getattr(target, name)
        return target
    raise ImportError(reference)


def test_every_import_path_the_docs_show_works() -> None:
    references = _documented_imports()
    assert "lightning_ort.callbacks.ONNXExport" in references or "lightning_ort.callbacks:ONNXExport" in references
    failed = []
    for reference in references:
        try:
            _resolve(reference)
        except (ImportError, AttributeError) as error:
            failed.append(f"{reference}: {error}")
    assert not failed, failed


def test_every_class_the_docs_name_imports_from_the_package_or_its_callbacks() -> None:
    """A class named bare in the README or the docs (`ORTPrecision`, `ONNXExport`) is in ``lightning_ort`` or
    ``lightning_ort.callbacks``, where a user looks first."""
    import lightning_ort
    from lightning_ort import callbacks

    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    names = {name for path in texts for name in re.findall(r"`((?:ORT|ONNX)[A-Z]?[a-z]\w*)", path.read_text())}
    assert {"ORTStrategy", "ORTPrecision", "ONNXExport"} <= names
    missing = sorted(name for name in names if not hasattr(lightning_ort, name) and not hasattr(callbacks, name))
    assert not missing, f"named in the docs but not importable from lightning_ort or lightning_ort.callbacks: {missing}"


@pytest.mark.parametrize(
    "name", ["ORTPrecision", "ORTStrategy", "ORTDDPStrategy", "ORTFallbackError", "ORTModuleReport", "ORTStrategyMixin"]
)
def test_the_public_classes_import_from_the_package(name: str) -> None:
    import lightning_ort

    assert name in lightning_ort.__all__
    assert inspect.isclass(getattr(lightning_ort, name))


@pytest.mark.parametrize(
    "name", ["GraphSummary", "ONNXExport", "ONNXGraphDump", "ORTLogVerbosity", "ORTParityCheck", "ParityResult"]
)
def test_the_callbacks_import_from_lightning_ort_callbacks(name: str) -> None:
    from lightning_ort import callbacks

    assert name in callbacks.__all__ and inspect.isclass(getattr(callbacks, name))
