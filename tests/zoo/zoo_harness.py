"""The zoo's machinery: train one real model a few steps eagerly and with ``strategy="ort"``, and judge it.

A row of a zoo table (:class:`ZooModel`) builds a model from a config with random weights, makes its
batches and says how a step computes the loss; :func:`run_model` trains identical copies of it with
Lightning three times, one step each in turn:

- ``eager``: plain PyTorch (``strategy="auto"``);
- ``ulp``: plain PyTorch from the same weights moved by one float ulp (``torch.nextafter(w, inf)``),
  which measures how much this model amplifies rounding: the noise floor of its losses;
- ``ort``: ``strategy="ort"``.

The three fits run in threads that hand a baton to each other after every training step, so each step
runs alone and the machine's load falls on all three alike: step times measured side by side in one
process. :class:`ZooResult` then tells where the model ran (which modules ORT ran, what share of the
trainable parameters sit in them, why the rest fell back) and how far ORT's losses are from eager's.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import lightning as L
import torch
from helpers import trainer_kwargs
from torch import Tensor, nn
from torch.utils.data import DataLoader

import lightning_ort
from lightning_ort.report import ORTModuleReport

Where = Literal["all", "partly", "none"]
RUNS = ("eager", "ulp", "ort")
EARLY_STEPS = 2  # steps whose ORT losses must match eager's within EARLY_RTOL
EARLY_RTOL = 1e-5
NOISE_MULTIPLE = 10.0  # later steps: ORT may differ from eager by this multiple of the measured noise floor
LR = 0.1
STEPS = 5  # training steps of each fit in the tests


@dataclass(frozen=True)
class Expect:
    """What a row expects of ORT: the outcome the test holds it to, so that a regression fails.

    Attributes:
        where: ``"all"`` (every trainable parameter inside ORT graphs), ``"partly"`` (at least
            ``min_share`` of them) or ``"none"`` (the model trains in PyTorch).
        min_share: for ``"partly"``, the least share of trainable parameters inside ORT graphs.
        reason: a piece of the fallback reason that must be reported (required for ``"none"``; for ``"partly"``
            unless the row names the modules ORT runs, and the rest was never asked of ORT).
        graph_breaks: for ``"all"``, that ORT gives up on some module and runs its submodules instead (graph
            breaks); otherwise such a row must run as one graph per module it names (its whole forward when
            it names none).
    """

    where: Where
    min_share: float = 0.0
    reason: str | None = None
    graph_breaks: bool = False

    def __post_init__(self) -> None:
        if self.where == "partly" and not 0.0 < self.min_share < 1.0:
            raise ValueError(f"Expect('partly', min_share={self.min_share}): min_share must lie in (0, 1).")
        if self.where == "none" and not self.reason:
            raise ValueError("Expect('none') must name the reason the model falls back (reason='...').")


@dataclass(frozen=True)
class ZooModel:
    """One row of a zoo table.

    Attributes:
        name: the row's id (``family/model``).
        build: returns the network (an ``nn.Module`` with random weights, dropout off).
        batch: returns one batch from a seeded generator.
        loss: the loss of a training step, from the LightningModule (call it, it runs the network) and a batch.
        expect: the outcome the test holds it to.
        ort_options: arguments of ``ORTStrategy`` for the ORT fit (none: ``strategy="ort"`` as a user writes it).
        lr: SGD's learning rate.
        optimizer: builds the optimizer from the parameters instead of plain SGD at ``lr`` (the benchmark's
            workloads train with their own).
        note: anything the row does differently from a user's defaults, and why.
    """

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[torch.Generator], Any]
    loss: Callable[[L.LightningModule, Any], Tensor]
    expect: Expect
    ort_options: dict[str, Any] = field(default_factory=dict)
    lr: float = LR
    optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None
    note: str = ""

    def strategy(self) -> lightning_ort.ORTStrategy | str:
        return lightning_ort.ORTStrategy(**self.ort_options) if self.ort_options else "ort"


class ZooModule(L.LightningModule):
    """A LightningModule around a zoo network: ``forward`` calls the network, a step takes the row's loss,
    SGD without momentum (so every difference in the losses comes from the forward and backward), unless the
    row brings its own ``optimizer``."""

    def __init__(
        self,
        network: nn.Module,
        loss: Callable[[L.LightningModule, Any], Tensor],
        lr: float = LR,
        optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None,
    ) -> None:
        super().__init__()
        self.network = network
        self._loss = loss
        self.lr = lr
        self._optimizer = optimizer

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.network(*args, **kwargs)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._loss(self, batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self._optimizer is not None:
            return self._optimizer(list(self.parameters()))
        return torch.optim.SGD(self.parameters(), lr=self.lr)


@dataclass
class Run:
    """One of the three fits of a row: its losses and step times, and for ORT what ran where."""

    name: str
    losses: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    reports: list[ORTModuleReport] = field(default_factory=list)
    ort_share: float = 0.0
    ort_modules: list[str] = field(default_factory=list)
    error: BaseException | None = None


@dataclass
class ZooResult:
    """What :func:`run_model` measured for one row."""

    model: ZooModel
    runs: dict[str, Run]
    parameters: int

    @property
    def ort(self) -> Run:
        return self.runs["ort"]

    @property
    def where(self) -> Where:
        """Where the model ran: all trainable parameters inside ORT graphs, some, or none."""
        share = self.ort.ort_share
        return "all" if share >= 1.0 else "partly" if share > 0.0 else "none"

    @property
    def reasons(self) -> list[str]:
        """``module: reason`` for each module ORT gave up on, and for calls it left to PyTorch."""
        found = []
        for report in self.ort.reports:
            for reason in (report.fallback_reason, report.eval_fallback_reason, *report.torch_call_reasons):
                if reason is not None:
                    found.append(f"{report.name}: {reason}")
        return found

    @property
    def differences(self) -> list[float]:
        """|ORT - eager| loss per step."""
        return [abs(a - b) for a, b in zip(self.runs["eager"].losses, self.ort.losses, strict=True)]

    @property
    def noise(self) -> list[float]:
        """The noise floor per step: the largest |eager - eager from ulp-moved weights| up to that step."""
        floor, out = 0.0, []
        for a, b in zip(self.runs["eager"].losses, self.runs["ulp"].losses, strict=True):
            floor = max(floor, abs(a - b))
            out.append(floor)
        return out

    @property
    def bounds(self) -> list[float]:
        """What ORT's loss may differ from eager's at each step: ``EARLY_RTOL`` relative for the first
        ``EARLY_STEPS`` steps, then the larger of that and ``NOISE_MULTIPLE`` times the noise floor."""
        out = []
        for step, (loss, noise) in enumerate(zip(self.runs["eager"].losses, self.noise, strict=True)):
            early = EARLY_RTOL * max(abs(loss), 1e-8)
            out.append(early if step < EARLY_STEPS else max(early, NOISE_MULTIPLE * noise))
        return out

    @property
    def parity(self) -> bool:
        return all(d <= b for d, b in zip(self.differences, self.bounds, strict=True))

    @property
    def worst_ratio(self) -> float:
        """The largest difference / bound over the steps (<= 1 is parity)."""
        return max(d / b for d, b in zip(self.differences, self.bounds, strict=True))

    def median_step(self, run: str, skip: int = 1) -> float:
        times = self.runs[run].step_times
        return statistics.median(times[skip:] or times)

    @property
    def speed(self) -> float:
        """eager's median step time over ORT's (above 1: ORT is faster), steps after the first."""
        return self.median_step("eager") / self.median_step("ort")

    def summary(self) -> str:
        """One line on where it ran and its parity, for assertion messages and logs."""
        share = f"{self.ort.ort_share:.1%} of {self.parameters:,} parameters in ORT ({', '.join(self.ort.ort_modules)})"
        steps = ", ".join(f"{d:.2e}/{b:.2e}" for d, b in zip(self.differences, self.bounds, strict=True))
        return f"{self.model.name}: {self.where}, {share}; |ORT-eager|/bound per step: {steps}; reasons: {self.reasons}"


def perturb_by_one_ulp(module: nn.Module) -> None:
    """Move every parameter to the next float up (``torch.nextafter(w, inf)``), in place."""
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.nextafter(parameter, torch.full_like(parameter, float("inf"))))


def ort_parameter_share(model: nn.Module, reports: Sequence[ORTModuleReport]) -> tuple[float, list[str]]:
    """The share of ``model``'s trainable parameters inside modules ORT ran (calls in ORT, no fallback),
    and those modules' names."""
    trainable = {id(p): p.numel() for p in model.parameters() if p.requires_grad}
    inside: set[int] = set()
    names = []
    for report in reports:
        if report.ort_calls == 0 or report.fallback_reason is not None:
            continue
        try:
            module = model if report.name == "forward" else model.get_submodule(report.name)
        except AttributeError as error:  # a report name the zoo cannot place: say so rather than guess
            raise AssertionError(f"ORT report {report.name!r} names no submodule of {type(model).__name__}") from error
        names.append(report.name)
        inside.update(id(p) for p in module.parameters() if id(p) in trainable)
    total = sum(trainable.values())
    return (sum(trainable[i] for i in inside) / total if total else 0.0), names


class _Baton:
    """Lets the fits run one training step each, in a fixed order; a finished (or failed) fit drops out."""

    def __init__(self, order: Sequence[str]) -> None:
        self._order = list(order)
        self._turn = 0
        self._done: set[str] = set()
        self._condition = threading.Condition()

    def wait(self, name: str) -> None:
        with self._condition:
            self._condition.wait_for(lambda: self._order[self._turn] == name)

    def pass_on(self, name: str, finished: bool = False) -> None:
        with self._condition:
            if finished:
                self._done.add(name)
            if len(self._done) == len(self._order):
                return
            turn = self._turn
            while True:
                turn = (turn + 1) % len(self._order)
                if self._order[turn] not in self._done:
                    break
            self._turn = turn
            self._condition.notify_all()


class _Recorder(L.Callback):
    """Records each training step's loss and time; between steps, hands the baton on and waits for it again.

    A fit holds the baton whenever it runs, between its steps too (Lightning's loop, data loading), so
    the other fits' steps are timed alone.
    """

    def __init__(self, run: Run, baton: _Baton | None) -> None:
        self.run = run
        self.baton = baton
        self._start = 0.0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, *args: Any) -> None:
        self.run.step_times.append(time.perf_counter() - self._start)
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.run.losses.append(float(loss.detach()))
        if self.baton is not None and trainer.global_step < (trainer.max_steps or 0):
            self.baton.pass_on(self.run.name)
            self.baton.wait(self.run.name)


def _fit(module: ZooModule, batches: list[Any], strategy: Any, run: Run, baton: _Baton | None) -> None:
    if baton is not None:
        baton.wait(run.name)
    try:
        trainer = L.Trainer(
            strategy=strategy, max_steps=len(batches), callbacks=[_Recorder(run, baton)], **trainer_kwargs()
        )
        trainer.fit(module, DataLoader(batches, batch_size=None))
        if isinstance(trainer.strategy, lightning_ort.ORTStrategy):
            run.reports = [dataclasses.replace(report) for report in trainer.strategy.ort_reports]
            run.ort_share, run.ort_modules = ort_parameter_share(module, run.reports)
    except BaseException as error:  # reported by run_model, in the calling thread
        run.error = error
    finally:
        if baton is not None:
            baton.pass_on(run.name, finished=True)


def run_model(
    model: ZooModel, steps: int = 5, seed: int = 0, runs: Sequence[str] = RUNS, alternate: bool = False
) -> ZooResult:
    """Train ``model`` for ``steps`` steps in each of ``runs`` (see the module docstring).

    With ``alternate``, the fits run in threads that take one step each in turn (for step times measured
    side by side); otherwise one after another in this thread (each Python thread brings its own OpenMP
    thread team, whose spinning slows the others' first steps on a loaded machine).
    """
    torch.manual_seed(seed)
    network = model.build()
    generator = torch.Generator().manual_seed(seed)
    batches = [model.batch(generator) for _ in range(steps)]
    modules = {}
    for name in runs:
        modules[name] = ZooModule(copy.deepcopy(network), model.loss, model.lr, model.optimizer)
        if name == "ulp":
            perturb_by_one_ulp(modules[name])
    results = {name: Run(name) for name in runs}
    baton = _Baton(runs) if alternate else None
    fits = [
        (modules[name], batches, model.strategy() if name == "ort" else "auto", results[name], baton) for name in runs
    ]
    if alternate:
        threads = [threading.Thread(target=_fit, args=fit, name=f"zoo-{model.name}-{fit[3].name}") for fit in fits]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        for fit in fits:
            _fit(*fit)
    for run in results.values():
        if run.error is not None:
            raise RuntimeError(f"{model.name}: the {run.name} fit failed: {run.error!r}") from run.error
        if len(run.losses) != steps:
            raise RuntimeError(f"{model.name}: the {run.name} fit ran {len(run.losses)} of {steps} steps")
    parameters = sum(p.numel() for p in network.parameters() if p.requires_grad)
    return ZooResult(model, results, parameters)


def check(result: ZooResult) -> None:
    """Assert what a zoo test asserts: the row's expected outcome, ORT calls where it says ORT ran, a
    reason for whatever fell back, and loss parity within the row's measured noise floor."""
    expect, ort = result.model.expect, result.ort
    assert ort.reports, f"{result.model.name}: ORT wrapped no module"
    steps = len(ort.losses)
    for report in ort.reports:  # a module counted as in ORT ran every training step's call there
        if report.name in ort.ort_modules:
            assert report.ort_calls >= steps, f"{report.name}: {report.ort_calls} ORT calls in {steps} steps"
    if result.where != "all" and not result.model.ort_options.get("modules"):
        assert result.reasons, f"{result.model.name}: not all in ORT and no reason given: {result.summary()}"
    if result.where != expect.where:
        better = ("none", "partly", "all").index(result.where) > ("none", "partly", "all").index(expect.where)
        hint = "runs more in ORT than its row expects: tighten the row" if better else "regressed"
        raise AssertionError(f"{result.model.name} {hint} (expected {expect.where!r}): {result.summary()}")
    broken = [report.name for report in ort.reports if report.submodules]
    if expect.where == "all" and bool(broken) != expect.graph_breaks:
        hint = "runs as one graph: tighten the row (graph_breaks=False)" if expect.graph_breaks else "regressed"
        raise AssertionError(f"{result.model.name} {hint}; graph breaks at {broken}: {result.summary()}")
    if expect.where == "partly":
        assert ort.ort_share >= expect.min_share, f"share below {expect.min_share:.0%}: {result.summary()}"
    if expect.reason is not None:
        assert any(expect.reason in reason for reason in result.reasons), (
            f"{result.model.name}: no reason mentions {expect.reason!r}: {result.summary()}"
        )
    assert result.parity, f"{result.model.name}: losses differ beyond the bound: {result.summary()}"
