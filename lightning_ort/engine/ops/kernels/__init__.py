"""Ops on torch's kernels inside ORT's graph (ATen nodes; C++ in ``lightning_ort/engine/csrc``).

Per op family one module (``activations``, ``math_ops``, ``pooling``, ...) with its symbolics and
``register()``; shared: ``torch_kernels`` (the ATen node forms), ``gradient_overloads`` (which inputs need
gradients), ``shape_inference`` (output shapes), ``op_rewrites`` (faster export forms).

Part of the ops layer: may import ``lightning_ort.errors``, ``bootstrap`` and ``ops``.
"""
