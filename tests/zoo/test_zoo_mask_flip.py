"""Hugging Face models trained as one ORT graph while their attention mask flips between all ones and padded.

transformers' mask helpers branch on the mask's values in eager (``fast_all(padding_mask)``: "no token is
padded, let SDPA use is_causal instead of a mask"); under the export they take their tracing path instead,
which builds the mask from its values with tensor operations. A graph exported on a batch without padding
must therefore still train a padded batch at eager's losses, and the other way round: this test trains
all-ones masks, then padded ones, then all-ones again, and compares every step's loss with eager's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hf_zoo_models import HF_MODELS
from zoo_harness import ZooModel, check, run_model

# all-ones masks at these steps, padded ones at the others
_ALL_ONES = (0, 1, 4)
_ROWS = (
    "transformers/t5",
    "transformers/bart",
    "transformers/llama",
    "transformers/mistral",
    "transformers/bert-classifier",
)


def _flipping(batch: Callable[[torch.Generator], dict[str, Any]]) -> Callable[[torch.Generator], dict[str, Any]]:
    made = [0]

    def flipping(generator: torch.Generator) -> dict[str, Any]:
        step = made[0]
        made[0] += 1
        out = batch(generator)
        assert bool((out["attention_mask"] == 0).any()), "the row's batches are padded"
        if step in _ALL_ONES:
            out["attention_mask"] = torch.ones_like(out["attention_mask"])
        return out

    return flipping


@pytest.mark.parametrize("row", [row for row in HF_MODELS if row.name in _ROWS], ids=lambda row: row.name)
def test_one_graph_trains_at_eager_losses_when_the_mask_flips_between_all_ones_and_padded(row: ZooModel) -> None:
    model = dataclasses.replace(row, batch=_flipping(row.batch))
    result = run_model(model, steps=5)
    check(result)
    forward = result.ort.reports[0]
    assert forward.name == "forward"
    assert forward.fallback_reason is None and not forward.submodules, result.summary()
    assert forward.ort_calls == 5 and forward.torch_calls == 0, forward
    assert result.ort.ort_share == 1.0
