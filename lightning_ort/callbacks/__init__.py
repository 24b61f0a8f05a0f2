"""Lightning callbacks for runs with ``strategy="ort"``: graph dumps, ORT logging, parity checks, ONNX export."""

from lightning_ort.callbacks.graph_dump import ONNXGraphDump
from lightning_ort.callbacks.graph_summary import GraphSummary
from lightning_ort.callbacks.log_verbosity import ORTLogVerbosity
from lightning_ort.callbacks.onnx_export import ONNXExport
from lightning_ort.callbacks.parity import ORTParityCheck, ParityResult

__all__ = ["GraphSummary", "ONNXExport", "ONNXGraphDump", "ORTLogVerbosity", "ORTParityCheck", "ParityResult"]
