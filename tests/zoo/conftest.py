"""The zoo of real models (tests/zoo/README.md). ``vision/`` needs torchvision and timm, which load only in
the torch-2.14 run, so the main suite leaves it out; ``pytest tests/zoo/vision`` collects it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

collect_ignore = ["vision"]
