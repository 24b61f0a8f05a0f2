"""What lightning_ort installs into ONNX Runtime, against a recorded snapshot.

lightning_ort registers symbolics, gradient definitions and graph optimizers with ORT's process-wide
registries, and wraps ORT's methods with hooks (several hooks wrap the same method, so their order is
part of the behaviour). A restructuring of the engine must leave all of that as it was; a new op or hook
changes it on purpose. This test compares what is installed with ``tests/ort_registries.json``; after a
deliberate change, write the new snapshot with

    python tests/test_ort_registries.py --update

and review its diff like code: a hook that moved in a chain, or a gradient that changed, shows there.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

from lightning_ort import engine

SNAPSHOT = Path(__file__).with_name("ort_registries.json")
# the packages whose loaded modules lightning_ort may hook into (torch's: the shims that make ORT import)
HOOKED_PACKAGES = ("onnxruntime", "torch")


def _function(member: Any) -> Any:
    """The function inside a static, class or bound method; anything else as it is."""
    if isinstance(member, (staticmethod, classmethod, types.MethodType)):
        return member.__func__
    return member


def _name(function: Any) -> str:
    """A function by the name of its code (``installer.<locals>.hook``), which a move to another file keeps."""
    function = _function(function)
    if isinstance(function, types.FunctionType):
        return function.__code__.co_qualname
    return getattr(function, "__qualname__", type(function).__qualname__)


def _is_ours(function: Any) -> bool:
    function = _function(function)
    ours = f"{os.sep}lightning_ort{os.sep}"
    return isinstance(function, types.FunctionType) and ours in function.__code__.co_filename


def _chain(function: Any) -> list[str]:
    """The hooks around ``function``, outermost first, down to (not including) ORT's own."""
    names = []
    while function is not None and _is_ours(function):
        names.append(_name(function))
        function = getattr(_function(function), "__wrapped__", None)
    return names


def _hooks() -> dict[str, list[str]]:
    """Every function of ORT's and torch's modules and classes that lightning_ort replaced: its chain of hooks.

    Only where the function is defined: a module that imported a hooked function by name holds it too."""
    hooks: dict[str, list[str]] = {}
    for module_name, module in sorted(sys.modules.items()):
        if module is None or module_name.split(".")[0] not in HOOKED_PACKAGES:
            continue
        for name, value in sorted(vars(module).items()):
            if inspect.isclass(value) and value.__module__ == module_name:
                for attribute, member in sorted(vars(value).items()):
                    if chain := _chain(member):
                        hooks[f"{module_name}.{name}.{attribute}"] = chain
            elif (chain := _chain(value)) and value.__module__ == module_name:
                hooks[f"{module_name}.{name}"] = chain
    return hooks


def _gradient(definition: list[Any]) -> list[str]:
    """ORT's gradient definition (its pybind node objects) as one line per node."""
    lines = []
    for node in definition:
        attributes = ", ".join(f"{a.name}={a.value_json}:{a.dtype}{'*' * a.is_tensor}" for a in node.attributes)
        inputs, outputs = ", ".join(node.inputs), ", ".join(node.outputs)
        lines.append(f"{node.domain}::{node.op_type}({inputs}) -> ({outputs}) {{{attributes}}}")
    return lines


def snapshot() -> dict[str, Any]:
    """ORT's registries and hooks as lightning_ort leaves them once ORT is loaded."""
    engine.ortmodule_package()  # ORT's modules import only after lightning_ort's torch shims
    from onnxruntime.training.ortmodule._custom_gradient_registry import CustomGradientRegistry
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry
    from onnxruntime.training.ortmodule.graph_optimizer_registry import GraphOptimizerRegistry

    return {
        "symbolics": {key: _name(fn) for key, fn in CustomOpSymbolicRegistry._SYMBOLICS.items()},
        "gradients": {key: _gradient(definition) for key, definition in CustomGradientRegistry._GRADIENTS.items()},
        "stop_gradient_edges": {
            key: sorted(edges) for key, edges in CustomGradientRegistry._STOP_GRADIENT_EDGES.items()
        },
        "graph_optimizers": {
            target: [[_name(fn), devices, priority] for fn, devices, priority in entries]
            for target, entries in GraphOptimizerRegistry._OPTIMIZER_FUNCS.items()
        },
        "hooks": _hooks(),
    }


def test_what_lightning_ort_installs_into_ort_is_the_snapshot() -> None:
    recorded = json.loads(SNAPSHOT.read_text())
    current = json.loads(json.dumps(snapshot()))
    # the registries' order does not matter (some families register from sets), the hooks' order does
    for part in recorded:
        assert current[part] == recorded[part], part
    assert current["hooks"], "no hook found: the snapshot would not see a changed hook chain"


if __name__ == "__main__":
    if "--update" in sys.argv[1:]:
        SNAPSHOT.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {SNAPSHOT}")
    else:
        print(json.dumps(snapshot(), indent=1))
