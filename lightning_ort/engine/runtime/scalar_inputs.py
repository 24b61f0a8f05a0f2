"""Python ``bool``/``int``/``float`` arguments of a module's forward (``model(x, 0.5)``, ``return_features=False``).

ORT 1.19.2 turns each of them into a 0-d tensor graph input (``PrimitiveType.get_tensor``) and
feeds the current value on every call, so an int or float used in tensor arithmetic follows every
call. A bool's value is also part of ORT's input schema, so another value exports again; it is
handed to the traced forward as the Python bool it was, and ``if flag:`` becomes that export's
branch instead of a data-dependent condition the export would have to refuse.

ORT's per-step ``_reprocess_check`` asks every user input whether it requires grad, and failed on
these Python numbers (``'float' object has no attribute 'requires_grad'``); they never do.

An int or float the forward uses as a Python number (``if scale > 0``, ``range(n)``, a size,
``F.dropout(x, p)``) reaches the trace as a tensor, and the export is refused: the refusal now names
the argument and what to do.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

_BOOL_DTYPE = "<class 'bool'>_"  # PrimitiveType.get_primitive_dtype: the type and the value


_OWN_REASONS = ("UnsupportedOperatorError", "ORTUnsupportedModelError")
_NUMBERS_NOTE = (
    "the forward takes the Python number argument(s) {names}, which ORT feeds to its graph as tensors, so "
    "the forward cannot use them as Python numbers (in an `if`, range(), a size). Fix: make such a value a "
    "constructor argument, or keep the module out of ORT with ORTStrategy(modules=[...]) naming only other "
    "submodules. The export said: "
)


def _bools_as_constants(schema: Any) -> Any:
    from onnxruntime.training.utils.torch_io_helper import _TensorStub

    if isinstance(schema, _TensorStub):
        dtype = str(schema.dtype)
        return dtype == f"{_BOOL_DTYPE}True" if dtype.startswith(_BOOL_DTYPE) else schema
    if isinstance(schema, Mapping):
        return type(schema)(**{key: _bools_as_constants(value) for key, value in schema.items()})
    if isinstance(schema, (list, tuple)):
        values = [_bools_as_constants(value) for value in schema]
        return type(schema)._make(values) if hasattr(schema, "_make") else type(schema)(values)
    return schema


def _bool_arguments_as_python_bools() -> None:
    from onnxruntime.training.ortmodule import _io

    original = _io.unflatten_data_using_schema

    @functools.wraps(original)
    def unflatten_data_using_schema(data: Any, schema: Any) -> Any:
        return original(data, _bools_as_constants(schema))

    # only _FlattenedModule.forward, which calls the user's forward during the export, uses this name
    _io.unflatten_data_using_schema = unflatten_data_using_schema


def _python_numbers_in_reprocess_check() -> None:
    from onnxruntime.training.ortmodule._graph_transition_manager import GraphTransitionManager

    original = GraphTransitionManager.__dict__["_reprocess_check"].__func__

    @functools.wraps(original)
    def _reprocess_check(*, exported_model_info: Any, model_info_for_export: Any, **kwargs: Any) -> Any:
        numbers = set(model_info_for_export.onnx_graph_input_const_as_tensor or ())
        names = exported_model_info.onnx_graph_input_names
        exported_model_info.onnx_graph_input_names = [name for name in names if name not in numbers]
        try:
            return original(
                exported_model_info=exported_model_info, model_info_for_export=model_info_for_export, **kwargs
            )
        finally:
            exported_model_info.onnx_graph_input_names = names

    GraphTransitionManager._reprocess_check = staticmethod(_reprocess_check)  # type: ignore[method-assign]


def _numbers(model_info_for_export: Any) -> Iterator[str]:
    """Names of the int and float arguments ORT turned into tensors (bools are constants, see above)."""
    schemas = (model_info_for_export.onnx_graph_input_arg_schema, model_info_for_export.onnx_graph_input_kwarg_schema)
    stubs: dict[str, str] = {}

    def collect(schema: Any) -> None:
        if isinstance(schema, Mapping):
            schema = list(schema.values())
        if isinstance(schema, (list, tuple)):
            for value in schema:
                collect(value)
        elif hasattr(schema, "dtype") and hasattr(schema, "name"):
            stubs[schema.name] = str(schema.dtype)

    for schema in schemas:
        collect(schema)
    for name in model_info_for_export.onnx_graph_input_const_as_tensor or ():
        dtype = stubs.get(name, "")
        if not dtype.startswith(_BOOL_DTYPE):
            yield f"`{name}` ({dtype.removeprefix('<class ').removesuffix('>').strip(chr(39))})"


def _export_refusals_name_python_numbers() -> None:
    from onnxruntime.training.ortmodule._graph_transition_manager import GraphTransitionManager

    original = GraphTransitionManager.__dict__["_export_model"].__func__

    @functools.wraps(original)
    def _export_model(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except Exception as error:
            numbers = list(_numbers(kwargs["model_info_for_export"]))
            root: BaseException = error
            while root.__cause__ is not None:
                root = root.__cause__
            text = root.args[0] if len(root.args) == 1 and isinstance(root.args[0], str) else None
            # an operator the exporter lacks, or one of lightning_ort's refusals, has a reason of its own (ORT
            # passes the export's error on as the text of a RuntimeError)
            if numbers and text is not None and not any(name in text for name in _OWN_REASONS):
                # the root's text, which is what lightning_ort reports as the reason for the fallback
                root.args = (_NUMBERS_NOTE.format(names=", ".join(numbers)) + text,)
            raise

    GraphTransitionManager._export_model = staticmethod(_export_model)  # type: ignore[method-assign]


def install() -> None:
    """Install the hooks above (last in ``hooks.HOOKS``: around the other hooks on the same ORT functions)."""
    _bool_arguments_as_python_bools()
    _python_numbers_in_reprocess_check()
    _export_refusals_name_python_numbers()
