"""A forward that returns a constant tensor next to its results (transformers' sliding-window cache returns
``torch.tensor(sliding_window)``, Mistral's default) trains in ORT: ORT's gradient builder refused such a graph
("couldn't find the producer node, and it's not a graph input"), and the model went to graph breaks."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from helpers import assert_losses_match, assert_ort_ran, fit_both
from torch.utils.data import DataLoader

from lightning_ort import ORTStrategy


class _WithConstant(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        return {"out": self.layer(x), "window": torch.tensor(4096), "scale": torch.tensor([0.5, 2.0])}

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        output = self(batch)
        assert output["window"].item() == 4096 and output["scale"].tolist() == [0.5, 2.0]
        return (output["out"] * output["scale"].sum()).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_constant_outputs_train_in_ort() -> None:
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randn(3 + step, 4, generator=generator) for step in range(3)]
    eager, ort = fit_both(
        _WithConstant, lambda: DataLoader(batches, batch_size=None), max_steps=3, strategy=ORTStrategy(fullgraph=True)
    )
    (report,) = ort.reports
    assert report.fallback_reason is None, report.fallback_reason
    assert_ort_ran(ort, min_calls=3)
    assert_losses_match(eager, ort)
