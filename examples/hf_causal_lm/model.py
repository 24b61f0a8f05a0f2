"""A small Hugging Face ``transformers`` causal language model, trained on characters with Lightning.

The network is ``LlamaForCausalLM`` (or ``GPT2LMHeadModel``) built from a config with random weights (nothing
is downloaded), wrapped in a LightningModule whose ``forward`` calls it with ``labels``, so the loss is the
model's own (next-token cross-entropy, shifted inside the model). Under ``strategy: ort`` lightning_ort runs
what of it ORT can export and says, per module, what it ran and why the rest stayed in PyTorch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import lightning.pytorch as pl
import torch
import transformers
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

# The corpus examples/gpt ships (tiny Shakespeare, see examples/gpt/README.md).
DEFAULT_CORPUS = Path(__file__).resolve().parents[1] / "gpt" / "data" / "tinyshakespeare.txt"


class CharTokenizer:
    """Maps each distinct character of a text to an id (in sorted order), and back.

    Args:
        text: the text whose characters make up the vocabulary.
    """

    def __init__(self, text: str) -> None:
        self.chars: list[str] = sorted(set(text))
        if not self.chars:
            raise ValueError("CharTokenizer needs a non-empty text to build its vocabulary.")
        self.ids: dict[str, int] = {char: index for index, char in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        """Number of distinct characters."""
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``'s characters; a character outside the vocabulary raises ``ValueError``."""
        unknown = sorted(set(text) - self.ids.keys())
        if unknown:
            raise ValueError(f"CharTokenizer: characters {unknown!r} are not in the vocabulary.")
        return [self.ids[char] for char in text]

    def decode(self, ids: list[int] | Tensor) -> str:
        """The text of a sequence of ids."""
        values = ids.tolist() if isinstance(ids, Tensor) else ids
        return "".join(self.chars[int(index)] for index in values)


class Windows(Dataset[Tensor]):
    """``count`` windows of ``length`` token ids at offsets drawn once from ``seed``."""

    def __init__(self, tokens: Tensor, length: int, count: int, seed: int) -> None:
        if tokens.numel() <= length:
            raise ValueError(f"The text split has {tokens.numel()} tokens, not more than seq_len={length}.")
        generator = torch.Generator().manual_seed(seed)
        self.tokens = tokens
        self.length = length
        self.starts = torch.randint(0, tokens.numel() - length, (count,), generator=generator)

    def __len__(self) -> int:
        return self.starts.numel()

    def __getitem__(self, index: int) -> Tensor:
        start = int(self.starts[index])
        return self.tokens[start : start + self.length]


class CharDataModule(pl.LightningDataModule):
    """Windows of characters of a text file, 90 % for training and 10 % for validation.

    Args:
        path: the text file (tiny Shakespeare by default).
        batch_size: windows per batch.
        seq_len: characters per window.
        max_chars: use only this many leading characters (the vocabulary comes from the whole file).
        train_samples: training windows per epoch.
        val_samples: validation windows.
        seed: seed of the window offsets.
    """

    def __init__(
        self,
        path: str | Path = DEFAULT_CORPUS,
        batch_size: int = 16,
        seq_len: int = 64,
        max_chars: int | None = 300_000,
        train_samples: int = 3200,
        val_samples: int = 128,
        seed: int = 0,
    ) -> None:
        super().__init__()
        text = Path(path).read_text(encoding="utf-8")
        self.tokenizer = CharTokenizer(text)
        self.text = text if max_chars is None else text[:max_chars]
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.train_samples = train_samples
        self.val_samples = val_samples
        self.seed = seed
        self.train_windows: Windows | None = None
        self.val_windows: Windows | None = None

    @property
    def vocab_size(self) -> int:
        """Size of the character vocabulary (``HFCausalLM``'s ``vocab_size``)."""
        return self.tokenizer.vocab_size

    def setup(self, stage: str | None = None) -> None:
        tokens = torch.tensor(self.tokenizer.encode(self.text), dtype=torch.long)
        split = int(0.9 * tokens.numel())
        self.train_windows = Windows(tokens[:split], self.seq_len, self.train_samples, self.seed)
        self.val_windows = Windows(tokens[split:], self.seq_len, self.val_samples, self.seed + 1)

    def train_dataloader(self) -> DataLoader[Tensor]:
        assert self.train_windows is not None, "call setup() first"
        return DataLoader(self.train_windows, batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader[Tensor]:
        assert self.val_windows is not None, "call setup() first"
        return DataLoader(self.val_windows, batch_size=self.batch_size)


def causal_lm_config(
    architecture: Literal["llama", "gpt2"],
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    max_seq_len: int,
) -> transformers.PretrainedConfig:
    """A transformers config of the given architecture and size, with dropout off."""
    if architecture == "llama":
        return transformers.LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=4 * hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            max_position_embeddings=max_seq_len,
        )
    if architecture == "gpt2":
        return transformers.GPT2Config(
            vocab_size=vocab_size,
            n_embd=hidden_size,
            n_layer=num_layers,
            n_head=num_heads,
            n_positions=max_seq_len,
            bos_token_id=None,  # GPT-2's 50256 lies outside a character vocabulary
            eos_token_id=None,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    raise ValueError(f"architecture={architecture!r}: choose 'llama' or 'gpt2'.")


class HFCausalLM(pl.LightningModule):
    """A transformers causal LM (random weights, built from a config) trained on character windows.

    ``forward(input_ids, labels)`` returns the model's output (``.loss``, ``.logits``); the steps log its loss.

    Args:
        vocab_size: number of distinct tokens (``CharDataModule.vocab_size``).
        architecture: ``"llama"`` (``LlamaForCausalLM``) or ``"gpt2"`` (``GPT2LMHeadModel``).
        hidden_size: width of the residual stream.
        num_layers: transformer blocks.
        num_heads: attention heads per block.
        max_seq_len: longest input the position embeddings cover.
        lr: AdamW's learning rate.
    """

    def __init__(
        self,
        vocab_size: int,
        architecture: Literal["llama", "gpt2"] = "llama",
        hidden_size: int = 64,
        num_layers: int = 2,
        num_heads: int = 4,
        max_seq_len: int = 128,
        lr: float = 3e-3,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        config = causal_lm_config(architecture, vocab_size, hidden_size, num_layers, num_heads, max_seq_len)
        self.model = transformers.AutoModelForCausalLM.from_config(config)

    def forward(self, input_ids: Tensor, labels: Tensor | None = None) -> transformers.modeling_outputs.ModelOutput:
        return self.model(input_ids=input_ids, labels=labels)

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        loss = self(batch, labels=batch).loss
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        loss = self(batch, labels=batch).loss
        self.log("val_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
