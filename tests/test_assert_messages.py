"""A size formatted into the message of a check (torchvision's ViT) does not keep a module out of ORT.

``torch._assert(x.dim() == 3, f"Expected ... got {x.shape}")``: formatting ``torch.Size`` reads each
size with ``__index__``, which the export's checks took for a size turned into a Python integer. The
text reaches no graph; the same conversion elsewhere (an f-string used as a value) is still refused.
"""

from __future__ import annotations

import lightning as L
import torch
from helpers import assert_losses_match, assert_ort_ran, fit_both
from torch.utils.data import DataLoader

from lightning_ort import ORTStrategy


class _Checked(L.LightningModule):
    """torchvision's ``Encoder.forward`` idiom."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._assert(x.dim() == 3, f"Expected (batch_size, seq_length, hidden_dim) got {x.shape}")
        return self.layer(x).mean(1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _KeyedByShape(_Checked):
    """The formatted size decides something: it must stay refused."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = f"{x.shape}"
        return self.layer(x).mean(1) * len(key)


def _loader() -> DataLoader:
    # two sequence lengths: a frozen size would show in the second
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 3, 4, generator=generator),), (torch.randn(4, 5, 4, generator=generator),)]
    return DataLoader(batches * 2, batch_size=None)


def test_size_formatted_into_an_assertion_message_trains_in_ort() -> None:
    eager, ort = fit_both(_Checked, _loader, max_steps=4)
    assert_ort_ran(ort, min_calls=4)
    assert_losses_match(eager, ort)


def test_size_formatted_into_a_value_is_still_refused() -> None:
    _, ort = fit_both(_KeyedByShape, _loader, max_steps=2, strategy=ORTStrategy(fullgraph=True))
    (report,) = ort.reports
    assert report.fallback_reason is not None and "into a Python integer" in report.fallback_reason
