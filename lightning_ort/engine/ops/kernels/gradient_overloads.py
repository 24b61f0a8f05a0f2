"""Which inputs of lightning_ort's ATen nodes need gradients, told to ORT's gradient builder.

ORT leaves a gradient that no one needs (a first layer's images, frozen weights) out of the
gradient graph, and a kernel that still returns it fails ("invalid index -1"). ORT keys gradient
definitions by the forward node's overload name, so lightning_ort's operators with parameters and
its attention (``csrc/torch_kernels.cc``) have one overload per set of gradients needed, named after them
(``input_bias``, ``weight``, ``query_key_value``, ...; the plain name needs all), and
:func:`choose_overloads` picks the overload of every node each time ORT (re)builds the gradient
graph (the set of parameters that require gradients can change between builds).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import onnx

from lightning_ort.engine.ops import registry

GRAD_DOMAIN = "org.pytorch.aten"
# lightning_ort operators whose gradients depend on which inputs need them -> those inputs' names
# (inputs 0, 1, ... of the operator, in order), from the op registry
OPERATORS = registry.gradient_inputs()
# ONNX ops whose outputs carry no gradient (shapes, comparisons, indices): an attention mask built
# from a sequence's shape and a padding mask needs none.
NON_DIFFERENTIABLE = {
    "Shape", "Size", "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Not", "And", "Or", "Xor",
    "IsNaN", "IsInf", "NonZero", "ArgMax", "ArgMin", "Range", "ConstantOfShape", "EyeLike", "RandomNormalLike",
    "RandomUniformLike", "Bernoulli",
}  # fmt: skip
# ATen operators that stop gradients (``Tensor.detach()``, detach.py), from the op registry
STOP_GRADIENT_OPERATORS = registry.stop_gradient_operators()


def aten_node(operator: str, inputs: list[str], outputs: list[str], overload: str = "") -> tuple[Any, ...]:
    """A gradient-definition node that runs ``operator`` through ORT's ATen executor."""
    attributes = {"operator": {"value": operator, "dtype": "string"}}
    if overload:
        attributes["overload_name"] = {"value": overload, "dtype": "string"}
    return (("ATen", GRAD_DOMAIN), inputs, outputs, attributes)


def overload_name(slots: tuple[str, ...], needed: tuple[bool, ...]) -> str:
    """The overload of a node whose inputs named ``slots`` need gradients as ``needed`` says."""
    if all(needed):
        return ""
    return "_".join(slot for slot, need in zip(slots, needed, strict=True) if need)


def register_gradient(operator: str, backward: str, inputs: list[str], grads: list[str]) -> None:
    """Register the gradient of ``operator`` for every set of gradients a node can need.

    ``backward`` takes ``inputs`` and returns one tensor per entry of ``grads``: ORT's gradients of
    the inputs ``OPERATORS[operator]`` names, in order, and an empty name for each output ORT leaves
    out (a bias the operator lacks).
    """
    from onnxruntime.training.ortmodule._custom_gradient_registry import CustomGradientRegistry

    slots = OPERATORS[operator]
    positions = [index for index, grad in enumerate(grads) if grad]
    for needed in itertools.product((True, False), repeat=len(slots)):
        if not any(needed):
            continue  # ORT builds no gradient for such a node
        outputs = list(grads)
        for index, need in zip(positions, needed, strict=True):
            outputs[index] = grads[index] if need else ""
        overload = overload_name(slots, needed)
        node = aten_node(backward, inputs, outputs, overload)
        CustomGradientRegistry.register(GRAD_DOMAIN, "ATen", (operator, overload), _definition(node))


def register_simple_gradient(
    operator: str, backward: str, inputs: list[str], before: tuple[tuple[Any, ...], ...] = ()
) -> None:
    """Register ``backward``, which returns the gradient of input 0 only, as ``operator``'s gradient.

    ``before`` are gradient-definition nodes computing some of ``inputs`` (the input's ``Shape``).
    """
    from onnxruntime.training.ortmodule._custom_gradient_registry import CustomGradientRegistry

    node = aten_node(backward, inputs, ["GI(0)"])
    CustomGradientRegistry.register(GRAD_DOMAIN, "ATen", (operator, ""), _definition(*before, node))


def _definition(*nodes: tuple[Any, ...]) -> Callable[[], list[Any]]:
    return lambda: list(nodes)


def choose_overloads(model: onnx.ModelProto, inputs_requiring_grad: list[str]) -> None:
    """Give every lightning_ort node with parameters the overload for the gradients it needs.

    "Needs a gradient" is taken as "computed from a graph input that requires one", except through
    the nodes :func:`carries_gradient` says carry none. ORT's own analysis knows more
    non-differentiable edges; where the two differ, ORT's backward or graph build fails loudly (and
    lightning_ort falls back to PyTorch), it never computes wrongly.
    """
    reachable = set(inputs_requiring_grad)
    for node in model.graph.node:  # ONNX nodes are topologically sorted
        operator = aten_operator(node)
        slots = OPERATORS.get(operator) if operator is not None else None
        if slots is not None:
            inputs = list(node.input)
            needed = tuple(index < len(inputs) and inputs[index] in reachable for index in range(len(slots)))
            _set_overload(node, overload_name(slots, needed))
        if carries_gradient(node) and any(name in reachable for name in node.input):
            reachable.update(node.output)


def carries_gradient(node: onnx.NodeProto) -> bool:
    """Whether a gradient can pass ``node`` from its outputs to its inputs: not through the ops in
    NON_DIFFERENTIABLE nor the ATen operators in STOP_GRADIENT_OPERATORS (``detach``)."""
    operator = aten_operator(node)
    return node.op_type not in NON_DIFFERENTIABLE if operator is None else operator not in STOP_GRADIENT_OPERATORS


def aten_operator(node: onnx.NodeProto) -> str | None:
    """The torch operator an ``ATen`` node of ORT's graph runs (``lightning_ort::linear``, ...), or None."""
    if node.domain != GRAD_DOMAIN or node.op_type != "ATen":
        return None
    return next((attribute.s.decode() for attribute in node.attribute if attribute.name == "operator"), None)


def _set_overload(node: onnx.NodeProto, overload: str) -> None:
    attribute = next((attribute for attribute in node.attribute if attribute.name == "overload_name"), None)
    if attribute is not None:
        attribute.s = overload.encode()
    elif overload:
        node.attribute.append(onnx.helper.make_attribute("overload_name", overload))
