"""Decoder loops over ``nn.GRUCell``/``nn.LSTMCell`` train in ORT like eager (chunks.py).

A cell fed the embedding of its own ``argmax`` (greedy decoding) fell back to PyTorch: the export
lost the size of the gates' dimension, and torch's ``unsafe_chunk`` symbolic refused it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base
from torch import nn
from torch.utils.data import DataLoader

STEPS = 3  # decoder steps
VOCAB = 10


class GreedyDecoder(Base):
    """Decodes ``STEPS`` tokens from a state made of the input, feeding back the ``argmax`` token
    (``feed="argmax"``) or the expected embedding under the softmax (``feed="soft"``)."""

    def __init__(self, cell: str, feed: str) -> None:
        super().__init__()
        self.feed = feed
        self.embed = nn.Embedding(VOCAB, 8)
        self.cell = nn.GRUCell(8, 8) if cell == "gru" else nn.LSTMCell(8, 8)
        self.out = nn.Linear(8, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, c = torch.tanh(x), torch.zeros_like(x)
        token = self.embed(torch.zeros(x.shape[0], dtype=torch.long))
        logits = []
        for _ in range(STEPS):
            if isinstance(self.cell, nn.GRUCell):
                h = self.cell(token, h)
            else:
                h, c = self.cell(token, (h, c))
            logits.append(self.out(h))
            if self.feed == "argmax":
                token = self.embed(logits[-1].argmax(-1))
            else:
                token = logits[-1].softmax(-1) @ self.embed.weight
        return torch.stack(logits, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]).reshape(-1, VOCAB), batch[1].reshape(-1))


def _batches() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    sizes = (4, 3, 4, 2)
    return DataLoader(
        [(torch.randn(b, 8, generator=g), torch.randint(0, VOCAB, (b, STEPS), generator=g)) for b in sizes],
        batch_size=None,
    )


@pytest.mark.parametrize("feed", ["argmax", "soft"])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_decoder_cell_trains_in_ort_like_eager(cell: str, feed: str) -> None:
    eager, ort = fit_both(lambda: GreedyDecoder(cell, feed), _batches, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
