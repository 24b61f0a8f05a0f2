"""torchvision and timm models train through ORT as their rows in vision_models.py expect, at eager's losses.

Not collected by the main suite (torchvision's C++ ops load only against a matching torch build): run
``pytest tests/zoo/vision`` in the torch-2.14 environment (``bash scripts/test_torch.sh 2.14.1``).
"""

from __future__ import annotations

import pytest
from vision_models import VISION_MODELS
from zoo_harness import STEPS, ZooModel, check, run_model


@pytest.mark.parametrize("model", VISION_MODELS, ids=lambda model: model.name)
def test_trains_in_ort_as_its_row_expects(model: ZooModel) -> None:
    check(run_model(model, steps=STEPS))
