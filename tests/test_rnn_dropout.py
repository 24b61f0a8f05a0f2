"""``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` with ``dropout`` between layers train in ORT (rnn_dropout.py,
rnn.py); before, torch's export refused them in training and the model fell back to PyTorch.

ORT draws dropout masks from its own generator, so parity with eager is checked at ``dropout=1e-9``:
the layers are exported one by one with a ``Dropout`` between them, as for any non-zero dropout, but
neither side drops anything (10^-9 per element) and both scale by 1/(1 - 1e-9), which is 1.0 in float32.
That the masks really apply at a real dropout is checked on its own.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit, fit_both
from models import SequenceClassifier, sequence_batches, varying_sequences
from torch import nn
from torch.utils.data import DataLoader

from lightning_ort import ORTStrategy

STEPS = 4
NO_DROP = 1e-9


class Stacked(SequenceClassifier):
    """A recurrent layer (``cell``) and a head over its mean output and its final hidden states."""

    def __init__(self, cell: type[nn.Module], lr: float = 0.01, **rnn: Any) -> None:
        super().__init__()
        self.rnn = cell(8, 6, **rnn)
        self.batch_first = rnn.get("batch_first", False)
        self.head = nn.Linear(6 * (2 if rnn.get("bidirectional") else 1), 3)
        self.lr = lr
        self.outputs: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output, final = self.rnn(x if self.batch_first else x.transpose(0, 1))
        hidden = final[0] if isinstance(final, tuple) else final
        return self.head(output.mean(1 if self.batch_first else 0)) + hidden.sum((0, 2)).unsqueeze(1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        logits = self(batch[0])
        self.outputs.append(logits.detach().clone())
        return nn.functional.cross_entropy(logits, batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


CELLS = [nn.LSTM, nn.GRU, nn.RNN]


@pytest.mark.parametrize("cell", CELLS, ids=lambda cell: cell.__name__)
@pytest.mark.parametrize(
    "rnn",
    [{"num_layers": 3}, {"num_layers": 2, "bidirectional": True, "batch_first": True}],
    ids=["3-layers", "bidirectional-2-layers"],
)
def test_layers_with_dropout_train_in_ort_like_eager(cell: type[nn.Module], rnn: dict[str, Any]) -> None:
    make = lambda: Stacked(cell, dropout=NO_DROP, **rnn)  # noqa: E731
    eager, ort = fit_both(make, varying_sequences, STEPS, strategy=ORTStrategy(fallback="raise"))
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


@pytest.mark.parametrize("cell", CELLS, ids=lambda cell: cell.__name__)
def test_one_layer_ignores_dropout_as_eager_does(cell: type[nn.Module]) -> None:
    with pytest.warns(UserWarning, match="dropout"):
        make = lambda: Stacked(cell, dropout=0.5)  # noqa: E731
        make()
    eager, ort = fit_both(make, varying_sequences, STEPS, strategy=ORTStrategy(fallback="raise"))
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


@pytest.mark.parametrize("cell", CELLS, ids=lambda cell: cell.__name__)
def test_dropout_between_layers_draws_new_masks_every_step(cell: type[nn.Module]) -> None:
    """With a learning rate of 0 and one batch repeated, outputs change from step to step only
    through dropout: they do with dropout=0.5, and not with dropout=0."""
    # torch.manual_seed(0) seeds ORT too, and ORT's CPU Dropout then draws the same masks at its first
    # two calls (ORT seeds a std::minstd_rand0 with 0, then 1, and that engine treats 0 as 1)
    torch.manual_seed(1)
    batch = next(iter(sequence_batches([(4, 6)], 8)))
    for dropout, varies in ((0.5, True), (0.0, False)):
        model = Stacked(cell, lr=0.0, num_layers=2, dropout=dropout)
        steps = DataLoader([batch] * STEPS, batch_size=None)
        assert_ort_ran(fit(model, steps, ORTStrategy(fallback="raise"), STEPS), STEPS)
        changes = [not torch.equal(model.outputs[0], output) for output in model.outputs[1:]]
        assert all(changes) if varies else not any(changes), (dropout, changes)
