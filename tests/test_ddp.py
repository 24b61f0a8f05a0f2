"""ORTDDPStrategy: two CPU processes (gloo) train like one process on the same global batch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from helpers import trainer_kwargs
from lightning.pytorch.strategies import StrategyRegistry
from models import MLP, ChildrenOnly, mlp_loader
from torch.utils.data import DataLoader, DistributedSampler

from lightning_ort.ddp import ORTDDPStrategy
from lightning_ort.precision import ORTPrecision
from lightning_ort.wrapping import ORTStrategyMixin

ORTDDPStrategy.register_strategies(StrategyRegistry)  # until lightning_ort/__init__.py registers it

TESTS = Path(__file__).resolve().parent
STEPS = 6
LOCAL_BATCH = 8


class RankRecorder(L.Callback):
    """Saves, per rank, each step's loss and synchronised gradients, the ORT reports and the final weights."""

    def __init__(self, out_dir: str | None) -> None:
        self.out_dir = out_dir
        self.losses: list[float] = []
        self.grads: list[torch.Tensor] = []
        self.val_losses: list[float] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, *args: Any) -> None:
        self.losses.append(float(outputs["loss"]))

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        # after backward: DDP has averaged the gradients across ranks
        self.grads.append(torch.cat([p.grad.flatten() for p in pl_module.parameters()]).clone())

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.val_losses.append(float(trainer.callback_metrics["val_loss"]))

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.out_dir is None:
            return
        strategy = trainer.strategy
        record = {
            "losses": self.losses,
            "grads": self.grads,
            "val_losses": self.val_losses,
            "reports": [vars(r).copy() for r in getattr(strategy, "ort_reports", [])],
            "strategy": type(strategy).__name__,
            "world_size": trainer.world_size,
            "state": {k: v.detach().clone() for k, v in pl_module.state_dict().items()},
        }
        torch.save(record, Path(self.out_dir) / f"{trainer.state.fn.value}-rank{trainer.global_rank}.pt")


def single_process_reference(make_model: Any, **overrides: Any) -> tuple[list[float], list[torch.Tensor], dict]:
    """Eager PyTorch, one process, the global batch (both ranks' samples), in the order DDP's sampler gives."""
    torch.manual_seed(0)
    model = make_model()
    dataset = mlp_loader().dataset
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=0)  # Lightning's DDP default
    recorder = RankRecorder(None)
    trainer = L.Trainer(strategy="auto", max_steps=STEPS, callbacks=[recorder], **trainer_kwargs(**overrides))
    trainer.fit(model, DataLoader(dataset, batch_size=2 * LOCAL_BATCH, sampler=sampler))
    return recorder.losses, recorder.grads, model.state_dict()


def load_ranks(out_dir: Path, stage: str = "fit") -> list[dict]:
    return [torch.load(out_dir / f"{stage}-rank{rank}.pt", weights_only=False) for rank in (0, 1)]


def assert_ddp_matches_reference(ranks: list[dict], reference: tuple[list[float], list[torch.Tensor], dict]) -> None:
    ref_losses, ref_grads, ref_state = reference
    rank0, rank1 = ranks
    assert rank0["world_size"] == 2 and rank0["strategy"] == "ORTDDPStrategy"
    for rank in ranks:
        assert rank["reports"], "no module was wrapped in ORT"
        for report in rank["reports"]:
            assert report["fallback_reason"] is None and report["torch_calls"] == 0, report
        assert sum(report["ort_calls"] for report in rank["reports"]) >= STEPS
    assert len(rank0["grads"]) == len(rank1["grads"]) == len(ref_grads) == STEPS
    for step in range(STEPS):
        # identical on both ranks (DDP's all-reduce), and equal to one process's gradient on the global batch
        assert torch.equal(rank0["grads"][step], rank1["grads"][step]), f"step {step}: ranks differ"
        torch.testing.assert_close(rank0["grads"][step], ref_grads[step], atol=1e-6, rtol=1e-5)
    assert len(rank0["losses"]) == len(rank1["losses"]) == len(ref_losses) >= STEPS
    for batch, (loss0, loss1, expected) in enumerate(zip(rank0["losses"], rank1["losses"], ref_losses, strict=True)):
        assert (loss0 + loss1) / 2 == pytest.approx(expected, rel=1e-5), f"batch {batch}"
    for key, value in ref_state.items():
        assert torch.equal(rank0["state"][key], rank1["state"][key]), key
        torch.testing.assert_close(rank0["state"][key], value, atol=1e-6, rtol=1e-5)


# set in this process by an earlier spawn test (Lightning's launcher picks MASTER_PORT); a script starts afresh
_LAUNCH_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "LOCAL_RANK", "GLOBAL_RANK")


def run_script(script: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run ``script`` with the test modules importable; kill its whole process group if it hangs."""
    path = cwd / "script.py"
    path.write_text(textwrap.dedent(script))
    env = {key: value for key, value in os.environ.items() if key not in _LAUNCH_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, str(path)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"timed out after {timeout}s:\n{stdout[-2000:]}\n{stderr[-4000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.parametrize(
    ("name", "start_method"),
    [("ort_ddp", "popen"), ("ort_ddp_spawn", "spawn"), ("ort_ddp_fork", "fork"), ("ort_ddp_notebook", "fork")],
)
def test_registered_variants(name: str, start_method: str) -> None:
    trainer = L.Trainer(strategy=name, **trainer_kwargs(devices=2))
    strategy = trainer.strategy
    assert type(strategy) is ORTDDPStrategy and isinstance(strategy, ORTStrategyMixin)
    assert strategy._start_method == start_method
    assert strategy.num_processes == 2 and strategy.root_device == torch.device("cpu")
    ORTDDPStrategy.register_strategies(StrategyRegistry)  # registering twice is harmless


def test_every_ort_option_and_ddp_kwargs_are_taken() -> None:
    strategy = ORTDDPStrategy(
        modules=["body"],
        log_level="ERROR",
        fallback="raise",
        intra_op_num_threads=1,
        allow_spinning=True,
        custom_autograd=False,
        fused_optimizer=True,
        memory_optimization_level=1,
        find_unused_parameters=True,
        start_method="spawn",
    )
    assert strategy.modules == ["body"] and strategy.fallback == "raise" and strategy.custom_autograd is False
    assert strategy.fused_optimizer
    options = strategy.runtime_options
    assert options.log_level == "ERROR" and options.intra_op_num_threads == 1 and options.allow_spinning
    assert options.memory_optimization_level == 1
    assert strategy._ddp_kwargs == {"find_unused_parameters": True}
    trainer = L.Trainer(strategy=strategy, precision="bf16-mixed", **trainer_kwargs(devices=2))
    assert isinstance(trainer.strategy.precision_plugin, ORTPrecision)


def test_spawn_two_processes_match_one_process_on_the_global_batch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MLP()
    strategy = ORTDDPStrategy(start_method="spawn", intra_op_num_threads=1, fallback="raise")
    recorder = RankRecorder(str(tmp_path))
    trainer = L.Trainer(strategy=strategy, max_steps=STEPS, callbacks=[recorder], **trainer_kwargs(devices=2))
    trainer.fit(model, mlp_loader(batch_size=LOCAL_BATCH))
    ranks = load_ranks(tmp_path)
    assert_ddp_matches_reference(ranks, single_process_reference(MLP))
    # Lightning's spawn launcher loads rank 0's weights back into this process's model
    for key, value in model.state_dict().items():
        assert torch.equal(value, ranks[0]["state"][key]), key
    assert "forward" not in model.__dict__


POPEN_SCRIPT = """
import sys
import lightning as L
from lightning.pytorch.strategies import StrategyRegistry
from helpers import trainer_kwargs
from models import ChildrenOnly, mlp_loader
from test_ddp import LOCAL_BATCH, STEPS, RankRecorder
from lightning_ort.ddp import ORTDDPStrategy
from lightning_ort.precision import ORTPrecision

ORTDDPStrategy.register_strategies(StrategyRegistry)
L.seed_everything(0)
model = ChildrenOnly()
trainer = L.Trainer(
    strategy="ort_ddp", max_steps=STEPS, callbacks=[RankRecorder(".")],
    **trainer_kwargs(devices=2, limit_val_batches=2, accumulate_grad_batches=2),
)
trainer.fit(model, mlp_loader(batch_size=LOCAL_BATCH))
trainer.validate(model, mlp_loader(batch_size=LOCAL_BATCH, n=64))
sys.stdout.write(f"rank {trainer.global_rank} done\\n")  # one write: the ranks share stdout
sys.stdout.flush()
"""


_VALIDATE_REPORT = {
    "name": "forward",
    "ort_calls": 2,
    "torch_calls": 0,
    "fallback_reason": None,
    "eval_fallback_reason": None,
    "torch_call_reasons": {},
}


def test_ort_ddp_relaunches_the_script_and_switches_to_children(tmp_path: Path) -> None:
    """``"ort_ddp"``: Lightning runs the script once per rank; the steps never call ``self(...)``; gradients
    accumulate over 2 batches (DDP's ``no_sync`` on the first)."""
    result = run_script(POPEN_SCRIPT, tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "rank 0 done" in result.stdout
    ranks = load_ranks(tmp_path)
    assert [report["name"] for report in ranks[0]["reports"]] == ["forward", "body", "head"]
    assert len(ranks[0]["losses"]) == 2 * STEPS
    assert_ddp_matches_reference(ranks, single_process_reference(ChildrenOnly, accumulate_grad_batches=2))
    # validate runs without the DDP wrapper, through ORT's inference graph (validation_step calls self(x))
    for rank in load_ranks(tmp_path, "validate"):
        (report,) = rank["reports"]
        assert {key: report[key] for key in _VALIDATE_REPORT} == _VALIDATE_REPORT
        assert report["parameters"] > 0 and report["submodules"] == [] and report["size_exports"] == 0
        assert len(rank["val_losses"]) == 1


FORK_SCRIPT = """
import lightning as L
from helpers import trainer_kwargs
from models import MLP, mlp_loader
from test_ddp import RankRecorder
from lightning_ort.ddp import ORTDDPStrategy
from lightning_ort.precision import ORTPrecision

# ORT sessions of an earlier run in this process (garbage that is not collected yet) must not
# hang the forked children.
L.Trainer(strategy="ort", max_steps=2, **trainer_kwargs()).fit(MLP(), mlp_loader())
strategy = ORTDDPStrategy(start_method="fork", intra_op_num_threads=1)
trainer = L.Trainer(strategy=strategy, max_steps=3, callbacks=[RankRecorder(".")], **trainer_kwargs(devices=2))
trainer.fit(MLP(), mlp_loader(batch_size=8))
print("fork done")
"""


def test_fork_after_ort_ran_in_the_parent(tmp_path: Path) -> None:
    result = run_script(FORK_SCRIPT, tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "fork done" in result.stdout
    rank0, rank1 = load_ranks(tmp_path)
    assert [r["ort_calls"] for r in rank0["reports"]] == [r["ort_calls"] for r in rank1["reports"]] == [3]
    assert all(torch.equal(a, b) for a, b in zip(rank0["grads"], rank1["grads"], strict=True))
