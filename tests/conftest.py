import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "examples" / "gpt"))


@pytest.fixture(autouse=True)
def _seed() -> None:
    import torch

    torch.manual_seed(0)
