"""Layer 3, passes: rewrites of an exported ONNX graph before ORT builds its training graph.

``graph_rewrite`` indexes a graph for rewrites; the others each rewrite one pattern (attention fusion,
bidirectional RNN splitting, channels-last, concatenations with constant fills, unbind, ...).

May import: ``lightning_ort.errors``, ``bootstrap``, ``ops`` and other ``passes`` modules.
"""
