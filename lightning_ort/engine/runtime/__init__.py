"""Layer 5, runtime: ORTModule's lifecycle.

``ortmodule`` builds ORTModules from lightning_ort's typed options; ``patches`` installs the hooks into
ORTModule (export, graph passes, sessions) once ORT is loaded; the memory arena, backward-once checks,
Python scalar inputs, ORT's logs, the graphs ORT saves, and deployment artifacts.

May import: ``lightning_ort.errors`` and every lower engine layer (``bootstrap``, ``ops``, ``passes``, ``export``).
"""
