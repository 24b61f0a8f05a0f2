"""``nn.RNN`` on torch's kernels inside ORT's graph.

torch exports ``nn.RNN`` as ONNX ``RNN`` nodes, which ORT 1.19.2 runs but cannot differentiate
(no gradient builder for ``RNN``), so models with one fell back to PyTorch. Each layer and
direction is exported instead as an ATen node running ``torch.rnn_tanh``/``rnn_relu`` over one
layer (``csrc/rnn.cc``), the backward direction over the input reversed in time. Its gradients
are eager autograd's. A node's weights and biases are packed into one input (``Concat``, whose
gradient ORT has), so that its overloads need only say whether the input, the initial state and the
weights need gradients (gradient_overloads.py). The final states are the outputs' last steps (the
first for the backward direction).

Dropout between layers in training is an ONNX ``Dropout`` on each layer's output but the last, as
in eager (its masks come from ORT's generator, as for every dropout in ORT's graph). Packed
sequences keep torch's export (and fall back).
"""

from __future__ import annotations

from typing import Any

from torch.onnx._internal.torchscript_exporter import symbolic_helper, symbolic_opset9, symbolic_opset12

from lightning_ort.engine.ops.kernels.gradient_overloads import register_gradient
from lightning_ort.engine.ops.kernels.torch_kernels import ATEN, constant

OPERATOR = "lightning_ort::rnn_layer"


def _symbolic(relu: bool) -> Any:
    torch_export = symbolic_opset9._one_hidden_rnn("RNN_RELU" if relu else "RNN_TANH")

    @symbolic_helper.parse_args("v", "v", "v", "i", "i", "f", "i", "i", "i")
    def layers(
        g: Any,
        input: Any,
        hidden: Any,
        weight_list: Any,
        has_biases: int,
        num_layers: int,
        dropout: float,
        train: int,
        bidirectional: int,
        batch_first: int,
    ) -> Any:
        weights = symbolic_helper._unpack_list(weight_list)
        per_layer = 4 if has_biases else 2
        directions = 2 if bidirectional else 1
        hidden_size = symbolic_helper._get_tensor_dim_size(weights[1], 1)
        flags = [constant(g, bool(has_biases)), constant(g, relu)]
        sequence = g.op("Transpose", input, perm_i=[1, 0, 2]) if batch_first else input
        finals = []
        for layer in range(num_layers):
            if layer and dropout and train:
                sequence, _ = symbolic_opset12._dropout_returns_masked_input_and_mask(g, sequence, dropout, True)
            outputs = []
            for direction in range(directions):
                index = layer * directions + direction
                params = weights[index * per_layer : (index + 1) * per_layer]
                packed = g.op("Concat", *(symbolic_helper._reshape_helper(g, p, constant(g, [-1])) for p in params),
                              axis_i=0)  # fmt: skip
                state = g.op("Gather", hidden, constant(g, index), axis_i=0)
                output = g.op(ATEN, sequence, state, packed, *flags, constant(g, direction == 1), operator_s=OPERATOR)
                output.setType(sequence.type().with_sizes([None, None, hidden_size]))
                outputs.append(output)
                last = g.op("Gather", output, constant(g, 0 if direction else -1), axis_i=0)
                finals.append(symbolic_helper._unsqueeze_helper(g, last, [0]))
            sequence = outputs[0] if directions == 1 else g.op("Concat", *outputs, axis_i=2)
        output = g.op("Transpose", sequence, perm_i=[1, 0, 2]) if batch_first else sequence
        return output, g.op("Concat", *finals, axis_i=0)

    def symbolic(g: Any, *args: Any) -> Any:
        if symbolic_helper._is_tensor_list(args[3]):  # packed: (data, batch_sizes, hx, params, ...)
            return torch_export(g, *args)
        return layers(g, *args)

    return symbolic


def register() -> None:
    """Register the symbolics and the gradient with ORT's registries (process-wide)."""
    from onnxruntime.training.ortmodule._custom_op_symbolic_registry import CustomOpSymbolicRegistry

    CustomOpSymbolicRegistry.register("rnn_tanh", "", _symbolic(relu=False))
    CustomOpSymbolicRegistry.register("rnn_relu", "", _symbolic(relu=True))
    register_gradient(OPERATOR, f"{OPERATOR}_backward", ["GO(0)", "I(0)", "I(1)", "I(2)", "I(3)", "I(4)", "I(5)"],
                      ["GI(0)", "GI(1)", "GI(2)"])  # fmt: skip
