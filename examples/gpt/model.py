"""A small GPT-style character-level language model and its data, for training with ``strategy="ort"``.

The model is written so that ORTModule can export it with TorchScript tracing: ``forward`` has no
Python control flow that depends on tensor values and uses no custom ``autograd.Function``.
"""

from __future__ import annotations

import math
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

DEFAULT_CORPUS = Path(__file__).resolve().parent / "data" / "tinyshakespeare.txt"


class CharTokenizer:
    """Maps each distinct character of a text to an integer id, in sorted character order.

    Args:
        text: the text whose characters make up the vocabulary.
    """

    def __init__(self, text: str) -> None:
        self.chars: list[str] = sorted(set(text))
        if not self.chars:
            raise ValueError("CharTokenizer needs a non-empty text to build its vocabulary.")
        self.stoi: dict[str, int] = {ch: i for i, ch in enumerate(self.chars)}
        self.itos: dict[int, str] = dict(enumerate(self.chars))

    @property
    def vocab_size(self) -> int:
        """Number of distinct characters."""
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        """Ids of the characters of ``text``; raises ``KeyError`` on a character outside the vocabulary."""
        return [self.stoi[ch] for ch in text]

    def decode(self, ids: list[int] | Tensor) -> str:
        """The text of a sequence of ids."""
        if isinstance(ids, Tensor):
            ids = ids.tolist()
        return "".join(self.itos[int(i)] for i in ids)


class RandomWindowDataset(Dataset[tuple[Tensor, Tensor]]):
    """``num_samples`` windows of ``seq_len + 1`` tokens at random (seeded) offsets of ``data``.

    Item ``i`` is ``(window[:-1], window[1:])``: the input and the next-token targets. The offsets
    are drawn once, from ``seed``, so the dataset is the same on every run.
    """

    def __init__(self, data: Tensor, seq_len: int, num_samples: int, seed: int) -> None:
        if data.numel() < seq_len + 1:
            raise ValueError(f"The text split has {data.numel()} tokens, fewer than seq_len + 1 = {seq_len + 1}.")
        self.data = data
        self.seq_len = seq_len
        generator = torch.Generator().manual_seed(seed)
        self.starts = torch.randint(0, data.numel() - seq_len, (num_samples,), generator=generator)

    def __len__(self) -> int:
        return self.starts.numel()

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        start = int(self.starts[index])
        window = self.data[start : start + self.seq_len + 1]
        return window[:-1], window[1:]


class CharDataModule(pl.LightningDataModule):
    """Character-level language-modelling data from a text file, split 90/10 into train and validation.

    The vocabulary is built from the whole file, so ``vocab_size`` does not depend on ``max_chars``.

    Args:
        path: the text file; the tiny Shakespeare copy shipped with the example by default.
        batch_size: windows per batch.
        seq_len: tokens per input window (each window holds ``seq_len + 1`` characters).
        max_chars: use only this many leading characters of the file (all of it when ``None``).
        train_samples: training windows per epoch; by default as many as fit side by side in the train split.
        val_samples: validation windows; by default as many as fit side by side in the validation split.
        seed: seed of the window offsets (training and validation windows use different streams).
        num_workers: DataLoader worker processes.
    """

    def __init__(
        self,
        path: str | Path = DEFAULT_CORPUS,
        batch_size: int = 16,
        seq_len: int = 64,
        max_chars: int | None = None,
        train_samples: int | None = None,
        val_samples: int | None = None,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.max_chars = max_chars
        self.train_samples = train_samples
        self.val_samples = val_samples
        self.seed = seed
        self.num_workers = num_workers
        text = self.path.read_text(encoding="utf-8")
        self.tokenizer = CharTokenizer(text)
        self.text = text if max_chars is None else text[:max_chars]
        self.train_dataset: RandomWindowDataset | None = None
        self.val_dataset: RandomWindowDataset | None = None

    @property
    def vocab_size(self) -> int:
        """Size of the character vocabulary (pass it to :class:`GPT`)."""
        return self.tokenizer.vocab_size

    def setup(self, stage: str | None = None) -> None:
        """Tokenize the text and build the train and validation window datasets."""
        if self.train_dataset is not None:
            return
        data = torch.tensor(self.tokenizer.encode(self.text), dtype=torch.long)
        split = int(0.9 * data.numel())
        train, val = data[:split], data[split:]
        window = self.seq_len + 1
        self.train_dataset = RandomWindowDataset(
            train, self.seq_len, self.train_samples or max(1, train.numel() // window), seed=self.seed
        )
        self.val_dataset = RandomWindowDataset(
            val, self.seq_len, self.val_samples or max(1, val.numel() // window), seed=self.seed + 1
        )

    def train_dataloader(self) -> DataLoader[tuple[Tensor, Tensor]]:
        """Training batches, in the (already random) order of the drawn windows."""
        assert self.train_dataset is not None, "call setup() first"
        return DataLoader(self.train_dataset, batch_size=self.batch_size, shuffle=False, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader[tuple[Tensor, Tensor]]:
        """Validation batches."""
        assert self.val_dataset is not None, "call setup() first"
        return DataLoader(self.val_dataset, batch_size=self.batch_size, shuffle=False, num_workers=self.num_workers)


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which each position attends only to itself and earlier positions.

    Args:
        d_model: width of the residual stream; must be divisible by ``n_heads``.
        n_heads: number of attention heads.
        max_seq_len: longest sequence the causal mask covers.
        dropout: dropout on the attention weights and on the output projection.
    """

    def __init__(self, d_model: int, n_heads: int, max_seq_len: int, dropout: float) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}.")
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        mask = torch.tril(torch.ones(max_seq_len, max_seq_len, dtype=torch.bool))
        self.register_buffer("causal_mask", mask.view(1, 1, max_seq_len, max_seq_len), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        batch, seq_len, d_model = x.shape
        qkv = self.qkv(x).view(batch, seq_len, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # each (batch, heads, seq_len, head_dim)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        mask = self.causal_mask[:, :, :seq_len, :seq_len]
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = self.attn_dropout(F.softmax(scores, dim=-1))
        out = (weights @ v).transpose(1, 2).reshape(batch, seq_len, d_model)
        return self.resid_dropout(self.proj(out))


class Block(nn.Module):
    """One pre-LayerNorm transformer block: ``x + attn(ln(x))`` then ``x + mlp(ln(x))``."""

    def __init__(self, d_model: int, n_heads: int, max_seq_len: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, max_seq_len, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model),
            nn.GELU(),
            nn.Linear(4 * d_model, d_model),
            nn.Dropout(dropout),
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(pl.LightningModule):
    """Decoder-only transformer language model over characters.

    ``forward(idx)`` maps token ids of shape ``(batch, seq_len)`` to next-token logits of shape
    ``(batch, seq_len, vocab_size)``; the loss is computed in the steps, in PyTorch.

    Args:
        vocab_size: number of distinct tokens.
        d_model: width of the embeddings and residual stream.
        n_heads: attention heads per block.
        n_layers: number of transformer blocks.
        max_seq_len: longest input the learned positional embedding covers.
        dropout: dropout probability (0 keeps training deterministic).
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 128,
        n_heads: int = 4,
        n_layers: int = 2,
        max_seq_len: int = 128,
        dropout: float = 0.0,
        lr: float = 3e-3,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Parameter(torch.zeros(1, max_seq_len, d_model))
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, max_seq_len, dropout) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)
        self.apply(self._init_weights)
        nn.init.normal_(self.pos_emb, mean=0.0, std=0.02)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.drop(self.tok_emb(idx) + self.pos_emb[:, : idx.shape[1]])
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def _loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("val_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)

    @torch.no_grad()
    def generate(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0) -> Tensor:
        """Sample ``max_new_tokens`` tokens after the prompt ``idx`` of shape ``(batch, t)`` (eager, not for export)."""
        for _ in range(max_new_tokens):
            context = idx[:, -self.hparams.max_seq_len :]
            logits = self(context)[:, -1, :] / temperature
            next_id = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat([idx, next_id], dim=1)
        return idx
