"""Checks on what the traced forward changes outside its outputs, which ORT's graph would never do again:
tensors it stores on a module, Python attributes it changes, parameters and inputs it changes in place
(buffers: ``buffer_writes.py``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from lightning_ort.engine.export.checks.export_check import ExportCheck, ExportContext, Recorder
from lightning_ort.engine.export.traced_calls import computed_from_inputs
from lightning_ort.engine.export.user_code import user_name
from lightning_ort.engine.export.value_traces import value_trace


@contextlib.contextmanager
def _parameter_versions(module: torch.nn.Module) -> Iterator[dict[str, int]]:
    """Every parameter's in-place modification counter, before the export."""
    yield {name: parameter._version for name, parameter in module.named_parameters()}


PARAMETER_VERSIONS = Recorder("parameter_versions", lambda context: _parameter_versions(context.module))


def _parameters_in_place(context: ExportContext) -> str | None:
    versions = context[PARAMETER_VERSIONS]
    in_place = [
        user_name(name)
        for name, parameter in context.module.named_parameters()
        if versions.get(name, -1) != parameter._version
    ]
    if not in_place:
        return None
    return (
        f"its forward changes parameter(s) {', '.join(in_place)} in place (nn.Embedding(max_norm=...) does); "
        "ORT's graph computes with the change but never writes it back to the parameter"
    )


@contextlib.contextmanager
def _input_copies() -> Iterator[list[tuple[torch.Tensor, int]]]:
    """The copies of the module's input tensors ORT's export runs the forward on, with their
    in-place modification counters when copied."""
    from onnxruntime.training.ortmodule import _io

    copies: list[tuple[torch.Tensor, int]] = []
    original = _io.deepcopy_model_input

    def deepcopy_model_input(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        values = (*result[0], *result[1].values())
        # inference tensors (torch.inference_mode(): predict, validate) have no counter and go unchecked
        copies.extend(
            (value, value._version) for value in values if torch.is_tensor(value) and not value.is_inference()
        )
        return result

    _io.deepcopy_model_input = deepcopy_model_input
    try:
        yield copies
    finally:
        _io.deepcopy_model_input = original


INPUT_COPIES = Recorder("input_copies", lambda context: _input_copies())


def _inputs_in_place(context: ExportContext) -> str | None:
    if not any(tensor._version != version for tensor, version in context[INPUT_COPIES]):
        return None
    return (
        "its forward changes an input tensor in place (x.mul_(2), x[:, 0] = 0, x.relu_()); ORT's graph works "
        "on its own copy, so the caller's tensor would not change as it does in eager. Fix: use out-of-place "
        "operations (x = x * 2), or clone the input first (x = x.clone())"
    )


def _computed_from_inputs(tensor: torch.Tensor) -> bool:
    """Whether the open trace computes ``tensor`` from the graph's inputs (the batch, the parameters),
    not from constants alone (a causal mask cached on first use)."""
    value = value_trace(tensor)
    return value is not None and computed_from_inputs(value)


@contextlib.contextmanager
def _record_stored_tensors(context: ExportContext) -> Iterator[list[str]]:
    """Where the traced forward stores tensors computed from its inputs on a module (an auxiliary loss read
    after forward, a memory for the next step): the ORT graph would never assign them again."""
    stored: list[str] = []

    def check_stored(traced: torch.nn.Module, args: Any, output: Any) -> None:  # while the trace is open
        if torch.jit.is_tracing():
            stored.extend(where for where in context.state.stored(_computed_from_inputs) if where not in stored)

    handle = context.module.register_forward_hook(check_stored)
    try:
        yield stored
    finally:
        handle.remove()


STORED_TENSORS = Recorder("stored_tensors", _record_stored_tensors)


def _stored_tensors(context: ExportContext) -> str | None:
    stored = context[STORED_TENSORS]
    if not stored:
        return None
    return (
        f"its forward stores tensor(s) {', '.join(stored)} on the module; ORT computes them inside its "
        "graph and would never assign them again, so code reading them after forward would see the export's. "
        "Fix: return them from forward"
    )


def _python_attributes(context: ExportContext) -> str | None:
    changes = context.state.changed()
    if not changes:
        return None
    return (
        f"its forward changes Python attribute(s) {', '.join(changes)}; ORT runs the traced graph "
        "and would never run that code again"
    )


TENSORS_STORED_ON_MODULE = ExportCheck("stored_tensors", _stored_tensors, reads=(STORED_TENSORS,))
PYTHON_ATTRIBUTES = ExportCheck("python_attributes", _python_attributes)
PARAMETERS_IN_PLACE = ExportCheck("parameters_in_place", _parameters_in_place, reads=(PARAMETER_VERSIONS,))
INPUTS_IN_PLACE = ExportCheck("inputs_in_place", _inputs_in_place, reads=(INPUT_COPIES,))
