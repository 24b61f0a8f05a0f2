"""Train the character-level GPT of this example, with or without ONNX Runtime.

Run from the repository root::

    python examples/gpt/train.py --strategy ort    # compute in ONNX Runtime (ORTModule)
    python examples/gpt/train.py --strategy auto   # plain PyTorch, for comparison
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

EXAMPLE_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(EXAMPLE_DIR))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from model import GPT, CharDataModule  # noqa: E402

import lightning_ort  # noqa: E402,F401  (registers strategy="ort")
from lightning_ort import ORTStrategy  # noqa: E402
from lightning_ort.timing import StepTimer  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategy", choices=["auto", "ort"], default="ort", help="'ort' runs the model in ORT")
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--n-layers", type=int, default=2)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    parser.add_argument("--max-chars", type=int, default=300_000, help="use only this prefix of the corpus")
    parser.add_argument("--data", type=Path, default=None, help="text file to train on (default: tiny Shakespeare)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--val-every", type=int, default=None, help="validate every N training steps (default: once, at the end)"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads(N); with --strategy ort also ORT's threads"
    )
    parser.add_argument("--no-logger", action="store_true", help="do not write a CSV log under examples/gpt/runs/")
    parser.add_argument("--sample", type=int, default=0, help="print N characters sampled from the trained model")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    # The tiny in-memory dataset does not need DataLoader workers.
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    L.seed_everything(args.seed)

    data_kwargs = {} if args.data is None else {"path": args.data}
    datamodule = CharDataModule(
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        max_chars=args.max_chars,
        # One epoch of exactly max_steps batches, so the end-of-epoch validation is the final one.
        train_samples=args.max_steps * args.batch_size,
        val_samples=8 * args.batch_size,
        seed=args.seed,
        **data_kwargs,
    )
    model = GPT(
        vocab_size=datamodule.vocab_size,
        d_model=args.d_model,
        n_heads=args.n_heads,
        n_layers=args.n_layers,
        max_seq_len=max(128, args.seq_len),
        lr=args.lr,
    )

    strategy: str | ORTStrategy = args.strategy
    if args.strategy == "ort" and args.threads is not None:
        strategy = ORTStrategy(intra_op_num_threads=args.threads)
    timer = StepTimer(warmup=5)
    logger = False if args.no_logger else CSVLogger(save_dir=EXAMPLE_DIR / "runs", name=args.strategy)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=strategy,
        max_steps=args.max_steps,
        val_check_interval=args.val_every,
        num_sanity_val_steps=0,
        logger=logger,
        log_every_n_steps=10,
        callbacks=[timer],
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=datamodule)

    metrics = trainer.callback_metrics
    for name in ("train_loss", "val_loss"):
        if name in metrics:
            print(f"final {name}: {metrics[name].item():.6f}")
    if timer.first_step is not None:
        print(f"first step: {timer.first_step:.3f} s")
    if timer.median_step is not None and timer.steps_per_second is not None:
        print(f"median step: {timer.median_step:.4f} s (steps {timer.warmup + 1}-{len(timer.step_times)})")
        print(f"steps/s: {timer.steps_per_second:.2f}")

    if args.sample > 0:
        model.eval()
        tokenizer = datamodule.tokenizer
        prompt = torch.tensor([tokenizer.encode("\n")], dtype=torch.long)
        generated = model.generate(prompt, max_new_tokens=args.sample)
        print("sample:")
        print(tokenizer.decode(generated[0]))


if __name__ == "__main__":
    main()
