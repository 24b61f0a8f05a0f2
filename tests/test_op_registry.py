"""The op registry (``lightning_ort/engine/ops/registry.py``) against what it describes: the operators the
C++ defines (drift), the files the build compiles, and the places that read the table.

The places that read it could drift from it only by someone writing an operator's facts there again by
hand; the C++ could drift by defining an operator the table does not list, or in another file.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from lightning_ort.engine.bootstrap import extensions
from lightning_ort.engine.ops import registry
from lightning_ort.engine.ops.kernels import activations, gradient_overloads, shape_inference
from lightning_ort.engine.passes import channels_last

CSRC = Path(registry.__file__).resolve().parents[1] / "csrc"
# C++ files that define no operator of ORT's graphs (the arena's controls, the custom-Function runner)
NOT_OPERATORS = {"memory_arena.cc", "custom_function_runner.cc"}
_DEFINITION = re.compile(r'\bm\.def\(\s*"(\w+)')


def _defined_operators() -> set[tuple[str, str]]:
    """(file, name) of every forward operator the C++ defines (a ``NAME_backward`` is its gradient)."""
    defined = set()
    for source in CSRC.glob("*.cc"):
        if source.name in NOT_OPERATORS:
            continue
        for name in _DEFINITION.findall(source.read_text()):
            if "_backward" not in name:
                defined.add((source.name, name))
    return defined


def test_the_table_lists_each_operator_the_cpp_defines_once_in_its_file() -> None:
    names = [operator.name for operator in registry.OPERATORS]
    assert len(names) == len(set(names))
    assert {(operator.kernel, operator.name) for operator in registry.OPERATORS} == _defined_operators()


def test_each_operator_has_its_backward() -> None:
    defined = {name for source in CSRC.glob("*.cc") for name in _DEFINITION.findall(source.read_text())}
    without = {operator.name for operator in registry.OPERATORS if f"{operator.name}_backward" not in defined}
    # those with a bias share the backward of the form without (it returns the bias's gradient when asked);
    # zeros_like has no gradient
    assert without == {"convolution_bias", "linear_bias", "convolution_bias_nhwc", "zeros_like"}


def test_the_build_compiles_every_file_of_the_table() -> None:
    built = {source.name for source in extensions.aten_ops_sources()}
    assert set(registry.kernel_files()) == built - {"memory_arena.cc", "pooling_ops.cc"}


def test_each_family_is_an_engine_module() -> None:
    for family in {operator.family for operator in registry.OPERATORS}:
        assert importlib.util.find_spec(f"lightning_ort.engine.{family}") is not None, family


def test_the_places_that_read_the_table_hold_its_facts() -> None:
    for operator, inputs in registry.gradient_inputs().items():
        assert gradient_overloads.OPERATORS[operator] == inputs
    for operator, rule in registry.shape_rules().items():
        assert shape_inference._OUTPUT_SHAPES[operator] is shape_inference._SHAPE_RULES[rule]
    assert set(shape_inference._SHAPE_RULES) == set(registry.ShapeRule.__args__)
    assert channels_last.ELEMENTWISE_OPERATORS == registry.elementwise_operators()
    assert activations.OPERATORS == registry.family_operators("ops.kernels.activations")
