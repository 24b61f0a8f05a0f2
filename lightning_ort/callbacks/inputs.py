"""A module's forward inputs, shaped the way ``torch.onnx.export`` (TorchScript exporter) wants them."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch

from lightning_ort.errors import ONNXExportError


@dataclass
class ForwardInput:
    """Positional and keyword arguments of one ``forward`` call."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_sample(cls, sample: Any) -> ForwardInput:
        """Lightning's ``example_input_array`` convention: a tuple or list holds positional
        arguments, a dict keyword arguments, anything else is the single argument."""
        if isinstance(sample, (tuple, list)):
            return cls(tuple(sample))
        if isinstance(sample, dict):
            return cls((), dict(sample))
        return cls((sample,))

    def detached(self, device: torch.device | None = None) -> ForwardInput:
        """A copy whose tensors are detached clones (on ``device`` if given)."""
        return ForwardInput(_detach(self.args, device), _detach(self.kwargs, device))

    def positional(self, module: torch.nn.Module) -> tuple[tuple[Any, ...], list[str]]:
        """The arguments as one positional tuple and the name of each, from ``forward``'s signature.

        Keyword arguments are placed where the signature puts them.
        """
        signature = inspect.signature(type(module).forward)
        parameters = list(signature.parameters.values())[1:]  # without self
        try:
            bound = signature.bind(None, *self.args, **self.kwargs)
        except TypeError as error:
            raise ONNXExportError(
                f"ONNXExport: the input sample does not fit {type(module).__name__}.forward: {error}"
            ) from error
        if bound.kwargs:
            raise ONNXExportError(
                f"ONNXExport: {type(module).__name__}.forward would get {', '.join(bound.kwargs)} by keyword only "
                "(keyword-only parameters, **kwargs, or an earlier optional argument left out), which the ONNX "
                "exporter cannot pass. Fix: pass an input_sample that gives the arguments in order."
            )
        values = bound.args[1:]
        names: list[str] = []
        for parameter in parameters:
            if len(names) == len(values):
                break
            if parameter.kind == inspect.Parameter.VAR_POSITIONAL:
                names += [f"{parameter.name}_{index}" for index in range(len(values) - len(names))]
                break
            names.append(parameter.name)
        return tuple(values), names


def exporter_args(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """``values`` for ``torch.onnx.export``, which reads a trailing dict as keyword arguments unless a
    (here empty) dict of keyword arguments follows it."""
    return (*values, {}) if values and isinstance(values[-1], dict) else values


def _detach(value: Any, device: torch.device | None) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.detach().clone()
        return value if device is None else value.to(device)
    if isinstance(value, tuple):
        return tuple(_detach(item, device) for item in value)
    if isinstance(value, list):
        return [_detach(item, device) for item in value]
    if isinstance(value, dict):
        return {key: _detach(item, device) for key, item in value.items()}
    return value


def flatten(value: Any, name: str) -> list[tuple[str, torch.Tensor]]:
    """The tensors in ``value`` with dotted names, in the order the exporter flattens them.

    Raises:
        ONNXExportError: ``value`` holds something other than tensors in tuples, lists and dicts.
    """
    if isinstance(value, torch.Tensor):
        return [(name, value)]
    if isinstance(value, (tuple, list)):
        return [leaf for index, item in enumerate(value) for leaf in flatten(item, f"{name}.{index}")]
    if isinstance(value, dict):
        return [leaf for key, item in value.items() for leaf in flatten(item, f"{name}.{key}")]
    raise ONNXExportError(
        f"ONNXExport: {name} is a {type(value).__name__}; only tensors, in tuples, lists and dicts, can be "
        "inputs and outputs of an exported ONNX model."
    )
