"""Ops exported as ONNX that ORT can train: export forms (symbolics) and ONNX gradients, no C++.

Part of the ops layer: may import ``lightning_ort.errors``, ``bootstrap`` and ``ops``.
"""
