"""More module families users train, each through ORT against eager PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from model import GPT
from models import MLP, Base, dict_loader, mlp_loader
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

STEPS = 8


def sequence_loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(96, 10, 8, generator=g), torch.randint(0, 3, (96,), generator=g)), 16)


def token_loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    windows = torch.randint(0, 65, (96, 17), generator=g)
    return DataLoader(TensorDataset(windows[:, :-1], windows[:, 1:]), 16)


class TiedGPT(GPT):
    """Output projection shares its weight with the token embedding."""

    def __init__(self) -> None:
        super().__init__(vocab_size=65, d_model=32, n_heads=4, n_layers=1, max_seq_len=16)
        self.head.weight = self.tok_emb.weight


class Recurrent(Base):
    def __init__(self, cell: type[nn.Module] = nn.LSTM) -> None:
        super().__init__()
        self.rnn = cell(8, 16, batch_first=True, num_layers=2)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0][:, -1])

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])


class PaddedEmbedding(Base):
    """padding_idx rows get no gradient in PyTorch."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16, padding_idx=0)
        self.head = nn.Linear(16, 2)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.head(self.embed(batch["input_ids"]).mean(1))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch), batch["label"])


class AttentionWithWeights(PaddedEmbedding):
    """nn.MultiheadAttention returning its attention weights, with a key padding mask."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden, mask = self.embed(batch["input_ids"]), batch["attention_mask"]
        out, weights = self.attention(hidden, hidden, hidden, key_padding_mask=~mask, need_weights=True)
        pooled = out.masked_fill(~mask[..., None], 0).sum(1) / mask.sum(1, keepdim=True)
        return self.head(pooled) + 0.1 * weights.mean()


class FrozenFirstLayer(MLP):
    def __init__(self) -> None:
        super().__init__()
        self.body[0].requires_grad_(False)


CASES = [
    ("tied_weights", TiedGPT, token_loader, {}),
    ("lstm", Recurrent, sequence_loader, {}),
    ("gru", lambda: Recurrent(nn.GRU), sequence_loader, {}),
    ("embedding_padding_idx", PaddedEmbedding, dict_loader, {}),
    ("attention_weights", AttentionWithWeights, dict_loader, {}),
    ("frozen_layer", FrozenFirstLayer, mlp_loader, {}),
    ("gradient_accumulation", MLP, mlp_loader, {"accumulate_grad_batches": 2}),
]


@pytest.mark.parametrize(
    ("make_model", "make_loader", "trainer_args"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_family_trains_in_ort_like_eager(make_model, make_loader, trainer_args) -> None:  # noqa: ANN001
    eager, ort = fit_both(make_model, make_loader, STEPS, **trainer_args)
    assert_ort_ran(ort, STEPS)
    assert_losses_match(eager, ort, rtol=2e-5)
    assert_states_match(eager, ort, atol=2e-5)
