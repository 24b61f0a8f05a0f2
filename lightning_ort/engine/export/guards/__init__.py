"""The guards: what the export recorded that lightning_ort's guard re-checks before every call of a module.

A graph holds what its export traced. Before each call, the guard asks whether it still holds: a Python value
the trace froze has changed (``python_reads``), a branch on the inputs' sizes or values would go the other
way (``size_guards``, with ``traced_sizes`` following sizes through the trace, ``size_programs`` the
expressions it keeps, and ``value_guards``), or a submodule gained a Python hook (``module_hooks``). If so,
ORT exports again, or the call runs in PyTorch.

May import: ``lightning_ort.errors``, ``bootstrap``, ``ops``, ``passes`` and the other ``export`` modules
(never ``export_guard`` or ``checks/``, which import these).
"""
