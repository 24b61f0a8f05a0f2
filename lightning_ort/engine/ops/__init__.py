"""Layer 2, ops: op coverage, what each torch op becomes in ORT's graph so that it trains as in PyTorch.

``kernels``: ops exported as ATen nodes that run torch's own kernels (C++ in ``lightning_ort/engine/csrc``),
with which of their inputs need gradients, their output shapes for ORT's shape inference and the op
rewrites. ``symbolics``: ops exported as ONNX ORT can train (export forms and ONNX gradients), no C++.
``registry``: one row per ``lightning_ort::`` operator (its C++ file, family, gradient inputs, shape rule,
layout), which ``gradient_overloads``, ``shape_inference`` and ``passes/channels_last`` read.

May import: ``lightning_ort.errors``, ``bootstrap`` and other ``ops`` modules.
"""
