"""lightning_ort: PyTorch Lightning training through ONNX Runtime's ORTModule."""

from lightning.pytorch.strategies import StrategyRegistry

from lightning_ort.ddp import ORTDDPStrategy
from lightning_ort.errors import (
    ONNXExportError,
    ORTExportTimeoutError,
    ORTFallbackError,
    ORTParityError,
    ORTSetupError,
    ORTUnsupportedModelError,
)
from lightning_ort.precision import ORTPrecision
from lightning_ort.report import ORTModuleReport
from lightning_ort.strategy import ORTStrategy
from lightning_ort.wrapping import ORTStrategyMixin

__version__ = "0.1.0"

__all__ = [
    "ONNXExportError",
    "ORTDDPStrategy",
    "ORTExportTimeoutError",
    "ORTFallbackError",
    "ORTModuleReport",
    "ORTParityError",
    "ORTPrecision",
    "ORTSetupError",
    "ORTStrategy",
    "ORTStrategyMixin",
    "ORTUnsupportedModelError",
    "__version__",
]

ORTStrategy.register_strategies(StrategyRegistry)
ORTDDPStrategy.register_strategies(StrategyRegistry)
