"""Layer 5, runtime: ORTModule's lifecycle.

``ortmodule`` builds ORTModules from lightning_ort's typed options (``settings``: what the hooks read for each
module); ``hooks`` installs the hooks into ORTModule once ORT is loaded, in a stated order (``export_hooks``,
``graph_hooks``, ``session_hooks``, ``log_hooks``); ``pipeline`` lists the export contexts and the graph checks
and passes in order; the memory arena, backward-once checks,
Python scalar inputs, ORT's logs, the graphs ORT saves, and deployment artifacts.

May import: ``lightning_ort.errors`` and every lower engine layer (``bootstrap``, ``ops``, ``passes``, ``export``).
"""
