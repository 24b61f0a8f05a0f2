"""The op registry (``lightning_ort/engine/ops/registry.py``) against what it describes: the operators the
C++ defines (drift), the files the build compiles, and the places that read the table.

The places that read it could drift from it only by someone writing an operator's facts there again by
hand; the C++ could drift by defining an operator the table does not list, or in another file.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

from lightning_ort.engine.bootstrap import extensions
from lightning_ort.engine.ops import registry
from lightning_ort.engine.ops.kernels import (
    activations,
    gradient_overloads,
    indexing,
    layers,
    math_ops,
    reductions,
    sampling,
    shape_inference,
    special_functions,
)
from lightning_ort.engine.passes import channels_last

CSRC = Path(registry.__file__).resolve().parents[1] / "csrc"
# C++ files that define no operator of ORT's graphs (the arena's controls, the custom-Function runner)
NOT_OPERATORS = {"memory_arena.cc", "custom_function_runner.cc"}
_DEFINITION = re.compile(r'\bm\.def\(\s*"(\w+)')
# special_functions.cc defines its functions through X-macros: ``#define UNARY_FUNCTIONS(X) X(lgamma, at::lgamma) ...``,
# each entry one operator and its ``_backward``
_X_MACRO = re.compile(r"#define \w+_FUNCTIONS\(X\)((?:[^\n]*\\\n)*[^\n]*)")
_X_ENTRY = re.compile(r"\bX\((\w+),")


def _names(source: Path) -> list[str]:
    """The operators ``source`` defines, forwards and backwards."""
    text = source.read_text()
    entries = [name for body in _X_MACRO.findall(text) for name in _X_ENTRY.findall(body)]
    return _DEFINITION.findall(text) + entries + [f"{name}_backward" for name in entries]


def _defined_operators() -> set[tuple[str, str]]:
    """(file, name) of every forward operator the C++ defines (a ``NAME_backward`` is its gradient)."""
    defined = set()
    for source in CSRC.glob("*.cc"):
        if source.name in NOT_OPERATORS:
            continue
        for name in _names(source):
            if "_backward" not in name:
                defined.add((source.name, name))
    return defined


def _ours() -> list[registry.Operator]:
    return [operator for operator in registry.OPERATORS if not operator.torch_operator]


def test_the_table_lists_each_operator_the_cpp_defines_once_in_its_file() -> None:
    names = [operator.qualified_name for operator in registry.OPERATORS]
    assert len(names) == len(set(names))
    assert {(operator.kernel, operator.name) for operator in _ours()} == _defined_operators()
    # the X-macros were read: 22 functions of one tensor, 10 of two
    assert len({name for file, name in _defined_operators() if file == "special_functions.cc"}) == 34


def test_each_operator_has_its_backward() -> None:
    defined = {name for source in CSRC.glob("*.cc") for name in _names(source)}
    without = {operator.name for operator in _ours() if f"{operator.name}_backward" not in defined}
    # those with a bias share the backward of the form without (it returns the bias's gradient when asked);
    # zeros_like has no gradient
    assert without == {"convolution_bias", "linear_bias", "convolution_bias_nhwc", "zeros_like"}


def test_torch_operators_rows_name_the_file_of_their_backward() -> None:
    ours = {operator.name for operator in _ours()}
    for operator in registry.OPERATORS:
        if not operator.torch_operator:
            continue
        assert operator.name not in ours, operator.name
        if operator.kernel is not None:
            assert f"{operator.name}_backward" in _names(CSRC / operator.kernel), operator.name


def test_the_build_compiles_every_file_of_the_table() -> None:
    built = {source.name for source in extensions.aten_ops_sources()}
    assert set(registry.kernel_files()) == built - {"memory_arena.cc", "pooling.cc"}


def test_each_family_is_an_engine_module() -> None:
    for family in {operator.family for operator in registry.OPERATORS}:
        assert importlib.util.find_spec(f"lightning_ort.engine.{family}") is not None, family


def test_the_places_that_read_the_table_hold_its_facts() -> None:
    assert gradient_overloads.OPERATORS == registry.gradient_inputs()
    assert gradient_overloads.STOP_GRADIENT_OPERATORS == registry.stop_gradient_operators()
    assert set(shape_inference._OUTPUT_SHAPES) == set(registry.shape_rules())
    for operator, rule in registry.shape_rules().items():
        if not isinstance(rule, registry.Reduction):
            assert shape_inference._OUTPUT_SHAPES[operator] is shape_inference._SHAPE_RULES[rule]
    assert set(shape_inference._SHAPE_RULES) == set(registry.ShapeRule.__args__)
    assert channels_last.ELEMENTWISE_OPERATORS == registry.elementwise_operators()
    assert activations.OPERATORS == registry.family_operators("ops.kernels.activations")


def test_the_families_declare_no_facts_of_their_own() -> None:
    for family in (math_ops, special_functions, layers, indexing, reductions, sampling):
        for name in ("SAME_SHAPE_OPERATORS", "BROADCAST_OPERATORS", "REDUCED_DIMS", "OUTPUT_SHAPES"):
            assert not hasattr(family, name), f"{family.__name__}.{name}"
    assert not hasattr(gradient_overloads, "add_operator")
    # special_functions exports torch's functions to the table's operators, and to no other
    exported = {*special_functions.UNARY.values(), *special_functions.BINARY.values(), "polygamma", "mvlgamma"}
    assert {f"lightning_ort::{name}" for name in exported} == set(
        registry.family_operators("ops.kernels.special_functions")
    )


def test_each_family_to_register_has_its_function() -> None:
    assert len(registry.FAMILIES) == len(set(registry.FAMILIES))
    for module, function in registry.FAMILIES:
        assert callable(getattr(importlib.import_module(f"lightning_ort.engine.{module}"), function)), module


def test_each_kernel_file_has_the_stem_of_its_familys_module() -> None:
    # torch_kernels.cc also defines the operators op_rewrites' matmul/softmax and BatchNorm forms run: one file
    # for the heavy layers on torch's kernels, whose symbolics three modules hold
    shared = {"ops.kernels.matmul_softmax": "torch_kernels.cc", "ops.kernels.batchnorm": "torch_kernels.cc"}
    for operator in registry.OPERATORS:
        if operator.kernel is None:  # one of torch's operators whose gradient is torch's own
            assert operator.torch_operator, operator.name
            continue
        expected = shared.get(operator.family, operator.family.rsplit(".", 1)[1] + ".cc")
        assert operator.kernel == expected, operator
