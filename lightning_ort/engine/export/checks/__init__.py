"""The export checks: each one a concern that refuses a module ORT would train wrongly, with its recorder
(entered around ORT's export), its logic and its message together (:class:`export_check.ExportCheck`).
``export_guard.py`` enters their recorders in ``RECORDERS``' order and asks the checks in
``EXPORT_CHECKS``' order, the first problem found being the refusal.

May import: ``lightning_ort.errors``, ``bootstrap``, ``ops``, ``passes`` and the other ``export`` modules
(never ``export_guard``, which imports these).
"""
