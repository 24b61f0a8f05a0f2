"""Layer 4, export: ORT's ONNX export of a module, and the checks that refuse what ORT would train wrongly.

``export_guard`` runs around ORT's export: it enters the recorders that watch the traced forward
(``traced_calls``, ``traced_numbers``, ``python_reads``, ``size_guards``, ``grad_regions``, ``view_writes``, ...)
and asks the export checks (``checks/``, one ordered list) whether to refuse a module whose graph would not
train as in PyTorch; checks on the exported graph (``sequences``, ``recurrent_weights``,
``batchnorm_order``); what lightning_ort's guard re-checks before every call (``guards/``: Python reads,
size and value guards, submodules' hooks); the export cache (``export_cache``, ``trace_record``).

May import: ``lightning_ort.errors``, ``bootstrap``, ``ops``, ``passes`` and other ``export`` modules.
"""
