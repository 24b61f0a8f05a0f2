"""Optimizer step time: torch AdamW (default foreach) vs lightning_ort's fused AdamW, same parameters.

    python benchmarks/fused_optimizer.py [--steps 50]

Both optimizers update the same set of parameters (the GPT-style model's) with the same gradients,
alternating step by step so that they share the machine's noise; medians are compared.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads import GPTBody  # noqa: E402

from lightning_ort.optim import fuse_optimizer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = GPTBody(vocab=1000, d_model=args.d_model, layers=args.layers, seq_len=128)
    twin = copy.deepcopy(model)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        a.grad = torch.randn_like(a) * 1e-3
        b.grad = a.grad.clone()
    plain = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    fused = fuse_optimizer(torch.optim.AdamW(twin.parameters(), lr=3e-4, weight_decay=0.1))
    times: dict[str, list[float]] = {"adamw": [], "fused": []}
    for _ in range(args.steps):
        for name, optimizer in (("adamw", plain), ("fused", fused)):
            start = time.perf_counter()
            optimizer.step()
            times[name].append(time.perf_counter() - start)
    params = sum(p.numel() for p in model.parameters())
    adamw, fused_median = statistics.median(times["adamw"][5:]), statistics.median(times["fused"][5:])
    drift = max((a - b).abs().max().item() for a, b in zip(model.parameters(), twin.parameters(), strict=True))
    print(f"parameters: {params / 1e6:.1f} M, threads: {torch.get_num_threads()}")
    print(
        f"torch AdamW step {adamw * 1000:.2f} ms, fused AdamW step {fused_median * 1000:.2f} ms: "
        f"fused is {adamw / fused_median:.2f}x as fast; max weight difference after {args.steps} steps {drift:.1e}"
    )


if __name__ == "__main__":
    main()
