"""``nn.LSTM`` and ``nn.GRU`` with ``dropout`` in training mode.

torch refuses to export a recurrent layer whose ``dropout`` is non-zero in training ("dropout in
training mode"), so such models fell back to PyTorch. Eager applies the dropout to the output of
every layer but the last; here each layer is exported on its own, by torch's export of a one-layer
LSTM/GRU (which ORT trains), with an ONNX ``Dropout`` between them. A one-layer LSTM/GRU applies no
dropout in eager (torch warns), so its ``dropout`` is dropped. As for every dropout in ORT's graph,
the masks come from ORT's random generator, not torch's. Packed sequences keep torch's export.

Under bfloat16 or float16 autocast eager runs an LSTM in that type, and the trace records its outputs
so (nothing casts them before the next layer); torch's export is ONNX's float32 LSTM, and the next
layer on torch's kernels met a float32 input and bfloat16 weights ("expected m1 and m2 to have the
same dtype" in backward). The outputs are cast to the traced type.

torch's export warns about batch sizes other than 1 at every LSTM/GRU; the warning concerns initial
states baked in at the export's batch size, which ORT's export takes from the input's dynamic size,
so it is silenced here.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch.onnx._internal.torchscript_exporter import _type_utils, symbolic_helper, symbolic_opset9, symbolic_opset12

_REDUCED = (_type_utils.JitScalarType.BFLOAT16, _type_utils.JitScalarType.HALF)


def _state(g: Any, states: Any, start: int, end: int) -> Any:
    return symbolic_helper._slice_helper(g, states, axes=[0], starts=[start], ends=[end])


def _initial(variant: str, states: list[Any]) -> Any:
    """torch's export takes an LSTM's (h0, c0) as a tuple and a GRU's h0 alone."""
    return tuple(states) if variant == "LSTM" else states[0]


def _layers(g: Any, variant: str, input: Any, hidden: Any, weight_list: Any, *flags: Any) -> Any:
    has_biases, num_layers, dropout, _, bidirectional, batch_first = (
        symbolic_helper._maybe_get_const(flag, kind) for flag, kind in zip(flags, "iifiii", strict=True)
    )
    weights = symbolic_helper._unpack_list(weight_list)
    states = symbolic_helper._unpack_list(hidden) if variant == "LSTM" else [hidden]
    directions = 2 if bidirectional else 1
    per_layer = (4 if has_biases else 2) * directions
    if len(weights) != per_layer * num_layers:  # LSTM(proj_size=...): torch's export refuses it
        return symbolic_opset9._generic_rnn(
            g, variant, input, _initial(variant, states), weights, has_biases, num_layers, dropout, 1,
            bidirectional, batch_first,
        )  # fmt: skip
    finals: list[list[Any]] = [[] for _ in states]
    output = input
    for layer in range(num_layers):
        if layer and dropout:
            output, _ = symbolic_opset12._dropout_returns_masked_input_and_mask(g, output, dropout, True)
        layer_states = [_state(g, state, layer * directions, (layer + 1) * directions) for state in states]
        output, *layer_finals = symbolic_opset9._generic_rnn(
            g,
            variant,
            output,
            _initial(variant, layer_states),
            weights[layer * per_layer : (layer + 1) * per_layer],
            has_biases,
            1,
            0.0,
            0,
            bidirectional,
            batch_first,
        )
        for collected, final in zip(finals, layer_finals, strict=True):
            collected.append(final)
    return output, *(g.op("Concat", *collected, axis_i=0) for collected in finals)


def _symbolic(variant: str) -> Any:
    torch_export = symbolic_opset9.lstm if variant == "LSTM" else symbolic_opset9._one_hidden_rnn(variant)

    def symbolic(g: Any, *args: Any) -> Any:
        packed = symbolic_helper._is_tensor_list(args[3])  # (data, batch_sizes, hx, params, ...)
        dropout, train = (symbolic_helper._maybe_get_const(value, "f") for value in args[5:7])
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Exporting a model to ONNX with a batch_size other than 1")
            outputs = torch_export(g, *args) if packed or not (dropout and train) else _layers(g, variant, *args)
        return _in_traced_types(g, outputs)

    return symbolic


def _in_traced_types(g: Any, outputs: Any) -> Any:
    """The outputs cast to the reduced precision the trace recorded for them (autocast), if it did."""
    cast = []
    for value, traced in zip(outputs, g.original_node.outputs(), strict=False):
        dtype = _type_utils.JitScalarType.from_value(traced, _type_utils.JitScalarType.UNDEFINED)
        if dtype in _REDUCED and _type_utils.JitScalarType.from_value(value, dtype) != dtype:
            value = g.op("Cast", value, to_i=dtype.onnx_type())
        cast.append(value)
    return tuple(cast)


def register() -> None:
    """Register the symbolics with ORT's registry (process-wide)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("lstm", "", _symbolic("LSTM"))
    CustomOpSymbolicRegistry.register("gru", "", _symbolic("GRU"))
