"""What happened to one wrapped module during a run: :class:`ORTModuleReport`."""

from __future__ import annotations

from dataclasses import dataclass, field

from lightning_ort.auto_choice import PYTORCH


@dataclass
class ORTModuleReport:
    """What happened to one wrapped module during a run.

    ORT builds separate graphs for training and for inference (eval mode or no grad), and either
    can be given up on its own.

    Attributes:
        name: where the module sits in the LightningModule (``"forward"`` for the LightningModule's own forward).
        ort_calls: forward calls ORT executed.
        torch_calls: forward calls PyTorch executed instead.
        fallback_reason: why ORT's training graph was given up, or ``None``.
        eval_fallback_reason: why ORT's inference graph was given up, or ``None``.
        torch_call_reasons: why single calls ran in PyTorch while ORT kept both graphs (a training-mode
            module under ``no_grad``, another autocast state), with how many calls each.
        parameters: the module's trainable parameters (elements) when it was wrapped.
        submodules: after ORT gave up on the module's training graph, the submodules ORT runs instead
            (each with a report of its own); the module's own code between them runs in PyTorch.
        size_exports: exports again because a Python branch on sizes went the other way for a call's
            input sizes than in the graph's export (``engine/export/guards/size_guards.py``).
        auto_choice: under ``ORTStrategy(mode="auto")``, the path the measurement chose (``"ort"`` or
            ``"pytorch"``), ``None`` while measuring or under ``mode="ort"``.
        measured_speedup: under ``mode="auto"``, ORT's measured speed relative to PyTorch's on this module
            (PyTorch's median step over ORT's; above 1: ORT faster).
        first_call_seconds: the wall time of ORT's first training call of this module (its forward, with the
            export and the graph builds), ``None`` before it.
    """

    name: str
    ort_calls: int = 0
    torch_calls: int = 0
    fallback_reason: str | None = None
    eval_fallback_reason: str | None = None
    torch_call_reasons: dict[str, int] = field(default_factory=dict)
    parameters: int = 0
    submodules: list[str] = field(default_factory=list)
    size_exports: int = 0
    auto_choice: str | None = None
    measured_speedup: float | None = None
    first_call_seconds: float | None = None

    @property
    def uses_ort(self) -> bool:
        """Whether ORT still runs this module in both modes."""
        return self.fallback_reason is None and self.eval_fallback_reason is None and self.auto_choice != PYTORCH
