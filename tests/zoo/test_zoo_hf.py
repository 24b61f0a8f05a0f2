"""Hugging Face transformers models train through ORT as their rows in hf_zoo_models.py expect, at eager's losses."""

from __future__ import annotations

import pytest
from hf_zoo_models import BLOCKS, HF_MODELS
from zoo_harness import STEPS, ZooModel, check, run_model


@pytest.mark.parametrize("model", HF_MODELS + BLOCKS, ids=lambda model: model.name)
def test_trains_in_ort_as_its_row_expects(model: ZooModel) -> None:
    check(run_model(model, steps=STEPS))
