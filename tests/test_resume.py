"""A run killed hard (SIGKILL) mid-step resumes from its last checkpoint to the same weights and losses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers import RunResult, assert_losses_match, assert_ort_ran, assert_states_match, fit
from models import CNN, image_loader

from lightning_ort import ORTStrategy

TESTS = Path(__file__).resolve().parent
BATCHES_PER_EPOCH = 8
EPOCHS = 4
KILL_AT_STEP = 21  # mid-epoch 2 (0-based); the last checkpoint is the end of epoch 1 (step 16)


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """One torch thread: on a machine shared with other work, OpenMP threads waiting on each other
    can make tiny steps 10x slower (docs/faq.md). The killed process uses one thread too, so that
    the runs compare bit for bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def loader() -> torch.utils.data.DataLoader:
    return image_loader(batch_size=16, n=16 * BATCHES_PER_EPOCH)


def strategy() -> ORTStrategy:
    return ORTStrategy(intra_op_num_threads=1, fallback="raise", mode="ort")  # ORT at every step, bit for bit


VICTIM = f"""
import sys, time
import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from helpers import fit
from models import CNN
from test_resume import loader, strategy


class Hang(L.Callback):
    # At step {KILL_AT_STEP}, after ORT's forward and before the backward: say so and wait to be killed.
    def on_before_backward(self, trainer, pl_module, loss):
        if trainer.global_step + 1 == {KILL_AT_STEP}:
            print("waiting to be killed", flush=True)
            time.sleep(600)


torch.set_num_threads(1)
torch.manual_seed(0)
checkpoints = ModelCheckpoint(dirpath=sys.argv[1], save_last=True, save_top_k=-1)
fit(CNN(), loader(), strategy(), max_steps=-1, max_epochs={EPOCHS}, enable_checkpointing=True,
    callbacks=[checkpoints, Hang()])
print("finished without being killed", flush=True)
"""


def run_and_kill(checkpoint_dir: Path, cwd: Path) -> None:
    script = cwd / "victim.py"
    script.write_text(textwrap.dedent(VICTIM))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    with open(cwd / "victim.err", "w") as stderr:
        victim = subprocess.Popen(
            [sys.executable, str(script), str(checkpoint_dir)],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
    try:
        assert victim.stdout is not None
        line = victim.stdout.readline()  # blocks until the victim reaches the step (or exits)
        if line.strip() == "waiting to be killed":
            victim.send_signal(signal.SIGKILL)
            assert victim.wait(timeout=60) == -signal.SIGKILL
    finally:
        if victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)
        victim.communicate()
    assert line.strip() == "waiting to be killed", line + (cwd / "victim.err").read_text()[-4000:]


def test_killed_run_resumes_like_an_uninterrupted_run(tmp_path: Path) -> None:
    run_and_kill(tmp_path / "checkpoints", tmp_path)
    last = tmp_path / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=False)
    assert checkpoint["global_step"] == 2 * BATCHES_PER_EPOCH and checkpoint["epoch"] == 1

    torch.manual_seed(0)
    uninterrupted = fit(CNN(), loader(), strategy(), max_steps=-1, max_epochs=EPOCHS)
    torch.manual_seed(123)  # the checkpoint, not the seed, decides the weights
    resumed = fit(CNN(), loader(), strategy(), max_steps=-1, max_epochs=EPOCHS, ckpt_path=last)

    assert resumed.trainer.global_step == uninterrupted.trainer.global_step == EPOCHS * BATCHES_PER_EPOCH
    assert_ort_ran(resumed, min_calls=(EPOCHS - 2) * BATCHES_PER_EPOCH)
    tail = RunResult(
        uninterrupted.losses[2 * BATCHES_PER_EPOCH :], uninterrupted.state, uninterrupted.trainer, uninterrupted.model
    )
    assert_losses_match(tail, resumed, rtol=0)  # bit-identical (same process layout, one ORT thread)
    # weights, BatchNorm statistics and counters
    assert_states_match(uninterrupted, resumed, atol=0, rtol=0)
    resumed_optimizer = resumed.trainer.optimizers[0].state_dict()["state"]
    for index, state in uninterrupted.trainer.optimizers[0].state_dict()["state"].items():
        assert torch.equal(resumed_optimizer[index]["momentum_buffer"], state["momentum_buffer"])
