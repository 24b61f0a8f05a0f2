"""Which inputs of lightning_ort's ATen nodes need gradients, told to ORT's gradient builder.

ORT leaves a gradient that no one needs (a first layer's images, frozen weights) out of the
gradient graph, and a kernel that still returns it fails ("invalid index -1"). ORT keys gradient
definitions by the forward node's overload name, so lightning_ort's operators (``csrc/aten_ops.cc``)
have ``frozen_input`` and ``frozen_params`` overloads whose backward kernels leave those gradients
undefined, and :func:`mark_frozen` picks the overload of every node each time ORT (re)builds the
gradient graph (the set of parameters that require gradients can change between builds).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx

GRAD_DOMAIN = "org.pytorch.aten"
FROZEN_INPUT = "frozen_input"
FROZEN_PARAMS = "frozen_params"
# lightning_ort operators whose input 0 is the data and input 1 the weight
OPERATORS = ("lightning_ort::convolution", "lightning_ort::convolution_bias", "lightning_ort::batch_norm")


def aten_node(operator: str, inputs: list[str], outputs: list[str], overload: str = "") -> tuple[Any, ...]:
    """A gradient-definition node that runs ``operator`` through ORT's ATen executor."""
    attributes = {"operator": {"value": operator, "dtype": "string"}}
    if overload:
        attributes["overload_name"] = {"value": overload, "dtype": "string"}
    return (("ATen", GRAD_DOMAIN), inputs, outputs, attributes)


def register_gradient(operator: str, backward: str, inputs: list[str], input_grad: str, param_grads: list[str]) -> None:
    """Register the gradient of ``operator`` and of its frozen overloads with ORT.

    ``backward`` returns the gradients of the data (``input_grad``) and of the parameters
    (``param_grads``); an empty output name is a slot ORT leaves out.
    """
    from onnxruntime.training.ortmodule._custom_gradient_registry import CustomGradientRegistry

    variants = {
        "": [input_grad, *param_grads],
        FROZEN_INPUT: ["", *param_grads],
        FROZEN_PARAMS: [input_grad, *[""] * len(param_grads)],
    }
    for overload, outputs in variants.items():
        node = aten_node(backward, inputs, outputs, overload)
        CustomGradientRegistry.register(GRAD_DOMAIN, "ATen", (operator, overload), _definition(node))


def _definition(node: tuple[Any, ...]) -> Callable[[], list[Any]]:
    return lambda: [node]


def mark_frozen(model: onnx.ModelProto, inputs_requiring_grad: list[str]) -> None:
    """Give every lightning_ort node the overload that matches which of its inputs need gradients.

    "Needs a gradient" is taken as "computed from a graph input that requires one", over all edges.
    ORT's own analysis also stops at non-differentiable edges; where the two differ, ORT's backward
    fails loudly (and lightning_ort falls back to PyTorch), it never computes wrongly.
    """
    reachable = set(inputs_requiring_grad)
    for node in model.graph.node:  # ONNX nodes are topologically sorted
        if node.domain == GRAD_DOMAIN and node.op_type == "ATen":
            attributes = {attribute.name: attribute for attribute in node.attribute}
            if attributes["operator"].s.decode() in OPERATORS:
                _set_overload(node, attributes, node.input[0] in reachable, node.input[1] in reachable)
        if any(name in reachable for name in node.input):
            reachable.update(node.output)


def _set_overload(node: Any, attributes: dict[str, Any], input_grad: bool, param_grads: bool) -> None:
    overload = ""
    if input_grad and not param_grads:
        overload = FROZEN_PARAMS
    elif param_grads and not input_grad:
        overload = FROZEN_INPUT
    if "overload_name" in attributes:
        attributes["overload_name"].s = overload.encode()
    elif overload:
        node.attribute.append(onnx.helper.make_attribute("overload_name", overload))
