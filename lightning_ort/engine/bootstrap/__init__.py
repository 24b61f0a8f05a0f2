"""Layer 1, bootstrap: make ONNX Runtime's training frontend importable and usable on this torch.

Checks the installed onnxruntime distribution (``flavour``), installs the torch-version shims ORT 1.19.2
needs (``torch_onnx``, ``nvtx``), builds lightning_ort's C++ extensions into a cache and registers them
under the names ORT imports (``extensions``, sources in ``lightning_ort/engine/csrc``), imports
``onnxruntime.training.ortmodule`` once (``loader``) and runs custom ``torch.autograd.Function``s inside
ORT's graphs (``custom_function``, its C++ runner built on first use).

May import: ``lightning_ort.errors`` and other bootstrap modules. What must happen after ORT is imported
(installing the runtime's hooks) is handed in by ``lightning_ort.engine`` (:func:`loader.run_after_import`).
"""
