"""lightning_ort.callbacks on real training runs: graph dumps, ORT logging, parity check, ONNX export."""

from __future__ import annotations

import argparse
import copy
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import onnx
import onnxruntime
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_ort_ran, fit, trainer_kwargs
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger
from models import CNN, MLP, ChildrenOnly, DataDependent, EncoderClassifier, dict_loader, image_loader, mlp_loader

import lightning_ort
from lightning_ort import ONNXExportError, ORTParityError
from lightning_ort.callbacks import ONNXExport, ONNXGraphDump, ORTLogVerbosity, ORTParityCheck

# ---------------------------------------------------------------------------------------------- ONNXGraphDump


def _all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attribute.g)
            for subgraph in attribute.graphs:
                yield from _all_nodes(subgraph)


def _summary_counts(text: str) -> dict[str, tuple[int, str]]:
    """file name -> (node count, ATen line) as written in summary.txt."""
    pattern = re.compile(r"^  (\S+\.onnx): (\d+) nodes\n.*\n    ATen fallback \(run by torch inside ORT\): (.*)$", re.M)
    return {name: (int(count), aten) for name, count, aten in pattern.findall(text)}


def test_graph_dump_saves_every_graph_ort_builds(tmp_path: Path) -> None:
    dump = ONNXGraphDump()
    fit(
        CNN(),
        image_loader(),
        "ort",
        2,
        val=image_loader(),
        val_check_interval=2,
        callbacks=[dump],
        default_root_dir=tmp_path,
    )
    directory = tmp_path / "onnx"  # <trainer.log_dir>/onnx; without a logger log_dir is default_root_dir
    assert dump.directory == directory
    files = sorted(path.name for path in directory.glob("*.onnx"))
    assert files == [
        "forward.inference.1_exported.onnx",
        "forward.inference.2_post_processed.onnx",
        "forward.inference.4_optimized.onnx",
        "forward.inference.5_execution.onnx",
        "forward.training.1_exported.onnx",
        "forward.training.2_post_processed.onnx",
        "forward.training.3_pre_grad.onnx",
        "forward.training.4_optimized.onnx",
        "forward.training.5_execution.onnx",
    ]
    summary = (directory / "summary.txt").read_text()
    counts = _summary_counts(summary)
    assert sorted(counts) == files
    for name in files:
        model = onnx.load(str(directory / name))
        onnx.checker.check_model(model)
        nodes = list(_all_nodes(model.graph))
        assert counts[name][0] == len(nodes), name
        aten = sum(node.domain == "org.pytorch.aten" for node in nodes)
        assert (counts[name][1] == "none") == (aten == 0), name
    # BatchNorm runs through torch's kernels inside ORT, forward and backward (channels-last after a
    # convolution); the summary says so
    aten = counts["forward.training.4_optimized.onnx"][1].split(", ")
    for operator in ["batch_norm_nhwc x2", "batch_norm_nhwc_backward x2", "batch_norm x1", "batch_norm_backward x1"]:
        assert f"lightning_ort::{operator}" in aten
    gradients = onnx.load(str(directory / "forward.training.4_optimized.onnx")).graph.output
    assert any(output.name.endswith("_grad") for output in gradients)


def test_graph_dump_keeps_chosen_stages_of_every_wrapped_module(tmp_path: Path) -> None:
    dump = ONNXGraphDump(dirpath=tmp_path / "graphs", stages=["exported", "execution"])
    # training_step calls the children, not self(...): ORTStrategy wraps `body` and `head` after the first step
    # without op_rewrites, so that the linear layers are ORT's own Gemm, which its session fuses
    strategy = lightning_ort.ORTStrategy(op_rewrites=False)
    result = fit(ChildrenOnly(), mlp_loader(), strategy, max_steps=3, callbacks=[dump])
    # a later run of the same Trainer adds its graphs: validation_step calls self(...), so `forward` runs in ORT
    result.trainer.limit_val_batches = 2
    result.trainer.validate(result.model, mlp_loader(n=32), verbose=False)
    assert sorted(path.name for path in (tmp_path / "graphs").iterdir()) == [
        "body.training.1_exported.onnx",
        "body.training.5_execution.onnx",
        "forward.inference.1_exported.onnx",
        "forward.inference.5_execution.onnx",
        "head.training.1_exported.onnx",
        "head.training.5_execution.onnx",
        "summary.txt",
    ]
    summary = (tmp_path / "graphs" / "summary.txt").read_text()
    # ORT's CPU session fuses Gemm with the activation after it; the exported graph has nothing fused
    assert re.search(r"body.training.1_exported.onnx: \d+ nodes\n.*\n.*\n    fused by ORT: none", summary)
    assert re.search(
        r"body.training.5_execution.onnx: \d+ nodes\n.*\n.*\n    fused by ORT: com.microsoft.FusedGemm", summary
    )
    assert "forward, training graph: not built: ORT did not run this module in this mode" in summary


def test_graph_dump_says_so_when_ort_fell_back(tmp_path: Path) -> None:
    dump = ONNXGraphDump(dirpath=tmp_path)
    with pytest.warns(UserWarning, match="ORT cannot run `forward`"):
        fit(DataDependent(), mlp_loader(), "ort", max_steps=2, callbacks=[dump])
    assert not list(tmp_path.glob("*.onnx"))
    summary = (tmp_path / "summary.txt").read_text()
    assert re.search(
        r"forward, training graph: ORT gave up on this graph; PyTorch ran the module instead\. "
        r"Reason: ORTUnsupportedModelError: .*Python control flow",
        summary,
    )


# -------------------------------------------------------------------------------------------- ORTLogVerbosity


class StepMarker(L.Callback):
    """Remembers how many log records existed at the end of each training step."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self.caplog = caplog
        self.marks: list[int] = []

    def on_train_batch_end(self, *args: Any) -> None:
        self.marks.append(len(self.caplog.records))


def _ort_records(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    return [record for record in records if record.name.startswith("lightning_ort.ort")]


def test_log_verbosity_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="lightning_ort")
    fit(MLP(), mlp_loader(), "ort", max_steps=2, callbacks=[ORTLogVerbosity("INFO")])
    records = _ort_records(caplog.records)
    assert any(r.levelno == logging.INFO and "Exporting the PyTorch model to ONNX" in r.getMessage() for r in records)
    assert min(record.levelno for record in records) == logging.INFO
    assert not logging.getLogger("orttraining").handlers  # ORT's logger is given back


def test_log_verbosity_verbose_export_step_then_quiet(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG, logger="lightning_ort")
    marker = StepMarker(caplog)
    fit(MLP(), mlp_loader(), "ort", max_steps=3, callbacks=[ORTLogVerbosity("WARNING", setup_level="VERBOSE"), marker])
    export_step = _ort_records(caplog.records[: marker.marks[0]])
    later_steps = _ort_records(caplog.records[marker.marks[0] :])
    # the export step logs everything, native runtime lines included, under lightning_ort.ort(.native)
    native = [record for record in export_step if record.name == "lightning_ort.ort.native"]
    assert any(r.levelno == logging.INFO and "Session successfully initialized" in r.getMessage() for r in native)
    assert any(record.levelno == logging.DEBUG for record in native)
    assert any(record.name == "lightning_ort.ort" and record.levelno == logging.INFO for record in export_step)
    # ... later steps log nothing below WARNING, although the session still writes verbose lines
    assert all(record.levelno >= logging.WARNING for record in later_steps)
    # native lines went to logging, not to stderr
    assert ":onnxruntime:" not in capfd.readouterr().err


def test_log_verbosity_obeys_the_users_logging_config(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.ERROR, logger="lightning_ort.ort.native")
    caplog.set_level(logging.DEBUG, logger="lightning_ort")  # last: it also sets caplog's handler level
    fit(MLP(), mlp_loader(), "ort", max_steps=2, callbacks=[ORTLogVerbosity("VERBOSE")])
    assert not [record for record in caplog.records if record.name == "lightning_ort.ort.native"]
    assert [record for record in caplog.records if record.name == "lightning_ort.ort"]
    assert ":onnxruntime:" not in capfd.readouterr().err  # filtered out, not leaked to stderr


def test_log_verbosity_leaves_ort_quiet_for_sessions_created_afterwards(capfd: pytest.CaptureFixture[str]) -> None:
    """A verbose ORT session lowers ORT's process-wide logger; its threads, and later sessions, wrote
    native lines straight to stderr after the callback's capture had ended."""
    fit(MLP(), mlp_loader(), "ort", max_steps=2, callbacks=[ORTLogVerbosity("VERBOSE")])
    capfd.readouterr()
    helper = onnx.helper
    relu = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(relu, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": np.array([-1.0, 2.0], dtype=np.float32)})[0].tolist() == [0.0, 2.0]
    assert ":onnxruntime:" not in capfd.readouterr().err


# -------------------------------------------------------------------------------------------- ORTParityCheck


class NoisyMLP(MLP):
    """Draws random numbers in training_step: the check must replay them and leave the RNG as it was."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x + 0.1 * torch.randn_like(x)), y)
        self.log("train_loss", loss)
        return loss


def _optimizer_state(trainer: L.Trainer) -> dict[str, Any]:
    return trainer.optimizers[0].state_dict()


@pytest.mark.parametrize(("make_model", "loader"), [(NoisyMLP, mlp_loader), (CNN, image_loader)], ids=["mlp", "cnn"])
def test_parity_check_passes_and_changes_nothing(make_model: Any, loader: Any) -> None:
    model = make_model()
    twin = copy.deepcopy(model)
    parity = ORTParityCheck(steps=3)
    torch.manual_seed(1)
    checked = fit(model, loader(), "ort", max_steps=5, callbacks=[parity])
    torch.manual_seed(1)
    plain = fit(twin, loader(), "ort", max_steps=5)
    assert [result.ok for result in parity.results] == [True, True, True]
    assert all(result.loss_rel_err < 1e-5 and result.grad_rel_err < 1e-4 for result in parity.results)
    assert "ort_parity/grad_rel_err" in checked.trainer.callback_metrics
    # exactly the same training: losses, weights, BatchNorm buffers, optimizer state, random state
    assert checked.losses == plain.losses
    assert checked.state.keys() == plain.state.keys()
    for key, value in checked.state.items():
        assert torch.equal(value, plain.state[key]), key
    checked_optimizer, plain_optimizer = (_optimizer_state(run.trainer)["state"] for run in (checked, plain))
    assert checked_optimizer.keys() == plain_optimizer.keys()
    for key, state in checked_optimizer.items():
        assert torch.equal(state["momentum_buffer"], plain_optimizer[key]["momentum_buffer"]), key
    assert checked.reports[0].ort_calls == plain.reports[0].ort_calls == 5  # the eager repeats bypassed ORT


class DivergesUnderExport(MLP):
    """Computes something else when traced for ONNX (which is what ORT runs) than eagerly."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.body(x)
        if torch.onnx.is_in_onnx_export():
            hidden = hidden * 1.5
        return self.head(hidden)


def test_parity_check_raises_on_divergence() -> None:
    with pytest.raises(ORTParityError, match=r"at step 0 \(batch 0\) ORT and eager PyTorch differ beyond rtol=0.0001"):
        fit(DivergesUnderExport(), mlp_loader(), "ort", max_steps=3, callbacks=[ORTParityCheck()])


def test_parity_check_warns_on_divergence_and_logs_the_errors(tmp_path: Path) -> None:
    parity = ORTParityCheck(steps=2, on_mismatch="warn")
    with pytest.warns(UserWarning, match=r"differ beyond .* in loss, body\.0\.weight"):
        fit(DivergesUnderExport(), mlp_loader(), "ort", 3, callbacks=[parity], logger=CSVLogger(tmp_path))
    assert len(parity.results) == 2 and not any(result.ok for result in parity.results)
    assert parity.results[0].loss_rel_err > 1e-3
    rows = (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    logged = [dict(zip(header, row.split(","), strict=True)) for row in rows[1:]]
    errors = [float(row["ort_parity/loss_rel_err"]) for row in logged if row["ort_parity/loss_rel_err"]]
    assert errors == pytest.approx([result.loss_rel_err for result in parity.results])


# ------------------------------------------------------------------------------------------------ ONNXExport


def test_onnx_export_of_a_cnn_trained_in_ort_is_standard_onnx(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="lightning_ort")
    export = ONNXExport(tmp_path / "cnn.onnx")
    result = fit(CNN(), image_loader(), "ort", max_steps=3, callbacks=[export])
    assert export.exported_path == tmp_path / "cnn.onnx"
    assert f"ONNXExport wrote {tmp_path / 'cnn.onnx'}" in caplog.text
    model = onnx.load(str(export.exported_path))
    onnx.checker.check_model(model)
    # ORT's training-time export rules (BatchNorm as org.pytorch.aten::ATen) stayed out
    assert {node.domain for node in model.graph.node} <= {""}
    assert [i.name for i in model.graph.input] == ["x"] and [o.name for o in model.graph.output] == ["output"]
    # another batch size than the sample's: the batch dimension is dynamic
    x = torch.randn(5, 3, 8, 8)
    session = onnxruntime.InferenceSession(str(export.exported_path), providers=["CPUExecutionProvider"])
    reference = CNN()
    reference.load_state_dict(result.state)
    with torch.no_grad():
        expected = reference.eval()(x).numpy()
    np.testing.assert_allclose(session.run(None, {"x": x.numpy()})[0], expected, rtol=1e-4, atol=1e-5)
    assert result.model.training  # modes given back


def test_to_onnx_after_an_ort_fit_is_standard_onnx(tmp_path: Path) -> None:
    """ORT's training export rules (BatchNorm as org.pytorch.aten::ATen, which ONNX Runtime cannot load)
    leave with the Trainer's run."""
    result = fit(CNN(), image_loader(), "ort", max_steps=2)
    x = torch.randn(2, 3, 8, 8)
    result.model.eval()
    result.model.to_onnx(tmp_path / "cnn.onnx", x, dynamo=False)
    assert {node.domain for node in onnx.load(str(tmp_path / "cnn.onnx")).graph.node} <= {""}
    session = onnxruntime.InferenceSession(str(tmp_path / "cnn.onnx"), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        expected = result.model(x).numpy()
    np.testing.assert_allclose(
        session.run(None, {session.get_inputs()[0].name: x.numpy()})[0], expected, rtol=1e-4, atol=1e-5
    )
    assert_ort_ran(fit(CNN(), image_loader(), "ort", max_steps=2), 2)  # the next ORTModule registers them again


class ExportEachValidation(L.Callback):
    """The user's own ``to_onnx`` during fit: through ORT it failed, and cost the module its inference graph."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.exported = directory, 0

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.to_onnx(self.directory / f"epoch{trainer.current_epoch}.onnx", torch.randn(2, 3, 8, 8), dynamo=False)
        self.exported += 1


def test_to_onnx_during_fit_leaves_ort_its_graphs(tmp_path: Path) -> None:
    export = ExportEachValidation(tmp_path)
    result = fit(CNN(), image_loader(n=128), "ort", -1, val=image_loader(), max_epochs=2, callbacks=[export])
    assert export.exported == 2 and (tmp_path / "epoch1.onnx").exists()
    (report,) = result.reports
    assert report.fallback_reason is None and report.eval_fallback_reason is None
    assert report.torch_calls == 0 and report.ort_calls > 0


def test_onnx_export_with_dict_input_from_the_first_training_forward(tmp_path: Path) -> None:
    export = ONNXExport(tmp_path / "encoder.onnx")
    fit(EncoderClassifier(), dict_loader(), "ort", max_steps=2, callbacks=[export])
    model = onnx.load(str(export.exported_path))
    assert [i.name for i in model.graph.input] == ["batch.input_ids", "batch.attention_mask"]  # "label" unused
    assert [o.name for o in model.graph.output] == ["output.logits", "output.pooled"]
    assert export.max_abs_diff is not None and export.max_abs_diff < 1e-5


def test_onnx_export_writes_on_device_training_artifacts(tmp_path: Path) -> None:
    from onnxruntime.training import api

    export = ONNXExport(tmp_path / "mlp.onnx", training_artifacts_dir=tmp_path / "artifacts", training_optimizer="SGD")
    model = MLP()
    model.example_input_array = torch.randn(4, 16)
    fit(model, mlp_loader(), "ort", max_steps=2, callbacks=[export])
    names = {path.name for path in export.artifacts}
    assert {"training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint"} <= names
    state = api.CheckpointState.load_checkpoint(str(tmp_path / "artifacts" / "checkpoint"))
    module = api.Module(str(tmp_path / "artifacts" / "training_model.onnx"), state)
    optimizer = api.Optimizer(str(tmp_path / "artifacts" / "optimizer_model.onnx"), module)
    module.train()
    x, y = next(iter(mlp_loader()))
    losses = []
    for _ in range(3):
        losses.append(float(module(x.numpy(), y.numpy())))
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[-1] < losses[0]


def test_onnx_export_without_an_input_sample_is_explained() -> None:
    with pytest.raises(ONNXExportError, match=r"ONNXExport needs an input sample: pass ONNXExport\(input_sample=...\)"):
        fit(ChildrenOnly(), mlp_loader(), "ort", max_steps=2, callbacks=[ONNXExport()])


# ------------------------------------------------------------------------------------------ arguments and CLI


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: ONNXGraphDump(stages=["optimised"]),
            ValueError,
            "unknown stage(s) ['optimised']; choose from exported",
        ),
        (lambda: ONNXGraphDump(stages="optimized"), TypeError, "must be a list of stages"),
        (lambda: ORTLogVerbosity("DEBUG"), ValueError, "ORTLogVerbosity(level='DEBUG') is not one of VERBOSE, INFO"),
        (lambda: ORTLogVerbosity(setup_level="LOUD"), ValueError, "ORTLogVerbosity(setup_level='LOUD') is not one of"),
        (lambda: ORTParityCheck(steps=0), ValueError, "ORTParityCheck(steps=0) must be a positive int"),
        (lambda: ORTParityCheck(rtol=-1.0), ValueError, "ORTParityCheck(rtol=-1.0) must be a finite float >= 0"),
        (lambda: ORTParityCheck(on_mismatch="ignore"), ValueError, "on_mismatch='ignore') must be 'raise' or 'warn'"),
        (lambda: ONNXExport("model.pt"), ValueError, "ONNXExport(path='model.pt') must name a .onnx file"),
        (lambda: ONNXExport(opset_version=25), ValueError, "ONNXExport(opset_version=25) must be an int from 7 to 21"),
        (lambda: ONNXExport(training_loss="NLLLoss"), ValueError, "training_loss='NLLLoss') is not one of Cross"),
    ],
)
def test_bad_arguments_are_explained(make: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        make()


def test_callbacks_warn_and_do_nothing_without_ort(tmp_path: Path) -> None:
    callbacks = [ONNXGraphDump(dirpath=tmp_path), ORTLogVerbosity("INFO"), ORTParityCheck()]
    with pytest.warns(
        UserWarning, match="does nothing: the Trainer's strategy is SingleDeviceStrategy, which does not run"
    ) as warned:
        fit(MLP(), mlp_loader(), "auto", max_steps=1, callbacks=callbacks)
    messages = " ".join(str(warning.message) for warning in warned)
    assert all(f"{type(callback).__name__} does nothing" in messages for callback in callbacks)
    assert not any(tmp_path.iterdir())


CLI_CALLBACKS = [
    {"class_path": "lightning_ort.callbacks.ONNXGraphDump", "init_args": {"stages": ["exported", "optimized"]}},
    {"class_path": "lightning_ort.callbacks.ORTLogVerbosity", "init_args": {"level": "ERROR", "setup_level": "INFO"}},
    {"class_path": "lightning_ort.callbacks.ORTParityCheck", "init_args": {"steps": 2, "on_mismatch": "warn"}},
    {"class_path": "lightning_ort.callbacks.ONNXExport", "init_args": {"path": "out/model.onnx", "verify": False}},
]


def _cli(callbacks: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> LightningCLI:
    monkeypatch.setattr(sys, "argv", ["train.py"])  # the config comes from `args`, not pytest's command line
    config = {"trainer": {**trainer_kwargs(), "strategy": "ort", "callbacks": callbacks}}
    return LightningCLI(MLP, run=False, args=config, save_config_callback=None, parser_kwargs={"exit_on_error": False})


def test_callbacks_from_lightning_cli_config(monkeypatch: pytest.MonkeyPatch) -> None:
    cli = _cli(CLI_CALLBACKS, monkeypatch)
    dump, verbosity, parity, export = (
        c for c in cli.trainer.callbacks if type(c).__module__.startswith("lightning_ort")
    )
    assert isinstance(dump, ONNXGraphDump) and dump.stages == ("exported", "optimized")
    assert isinstance(verbosity, ORTLogVerbosity) and (verbosity.level, verbosity.setup_level) == ("ERROR", "INFO")
    assert isinstance(parity, ORTParityCheck) and (parity.steps, parity.on_mismatch) == (2, "warn")
    assert isinstance(export, ONNXExport) and export.path == Path("out/model.onnx") and not export.verify


def test_lightning_cli_rejects_a_bad_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    bad = [{"class_path": "lightning_ort.callbacks.ORTParityCheck", "init_args": {"on_mismatch": "ignore"}}]
    with pytest.raises(
        argparse.ArgumentError, match=r"Expected a typing.Literal\['raise', 'warn'\]. Got value: ignore"
    ):
        _cli(bad, monkeypatch)
