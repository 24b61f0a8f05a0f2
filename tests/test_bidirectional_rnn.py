"""Bidirectional LSTMs and GRUs train in ORT like eager, split into forward nodes (bidirectional_rnn.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import SequenceClassifier, varying_sequences
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from torch import nn

from lightning_ort.callbacks import ONNXGraphDump
from lightning_ort.engine.passes.bidirectional_rnn import split_bidirectional_rnns


class Bidirectional(SequenceClassifier):
    """A bidirectional recurrent layer and a head over its mean output or over its final states."""

    def __init__(
        self, cell: type[nn.Module], batch_first: bool = True, num_layers: int = 1, states: bool = False
    ) -> None:
        super().__init__()
        self.rnn = cell(8, 6, batch_first=batch_first, num_layers=num_layers, bidirectional=True)
        self.batch_first, self.states = batch_first, states
        width = 2 * num_layers * 6 * (2 if cell is nn.LSTM else 1) if states else 12
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, final = self.rnn(x if self.batch_first else x.transpose(0, 1))
        if not self.states:
            return self.head(out.mean(1 if self.batch_first else 0))
        finals = final if isinstance(final, tuple) else (final,)
        return self.head(torch.cat([state.transpose(0, 1).flatten(1) for state in finals], 1))


@pytest.mark.parametrize(
    "make_model",
    [
        lambda: Bidirectional(nn.LSTM),
        lambda: Bidirectional(nn.GRU),
        lambda: Bidirectional(nn.LSTM, num_layers=2),
        lambda: Bidirectional(nn.LSTM, batch_first=False),
        lambda: Bidirectional(nn.GRU, batch_first=False, num_layers=2),
        lambda: Bidirectional(nn.LSTM, states=True),
        lambda: Bidirectional(nn.GRU, num_layers=2, states=True),
    ],
    ids=["lstm", "gru", "lstm-2-layers", "lstm-time-major", "gru-time-major-2-layers", "lstm-final-states",
         "gru-final-states"],
)  # fmt: skip
def test_bidirectional_rnn_trains_in_ort_like_eager(make_model: Any) -> None:
    eager, ort = fit_both(make_model, varying_sequences, 4)
    assert_ort_ran(ort, 4)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_training_graph_has_no_bidirectional_node(tmp_path: Path) -> None:
    dump = ONNXGraphDump(dirpath=tmp_path, stages=["optimized"])
    eager, ort = fit_both(lambda: Bidirectional(nn.LSTM, num_layers=2), varying_sequences, 2, callbacks=[dump])
    assert_ort_ran(ort, 2)
    model = onnx.load(str(tmp_path / "forward.training.4_optimized.onnx"))
    operators = [node.op_type for node in model.graph.node]
    directions = [
        attribute.s for node in model.graph.node for attribute in node.attribute if attribute.name == "direction"
    ]
    assert directions and set(directions) == {b"forward"}, directions
    # two layers, two directions each, with their gradients; the time reversals pass gradients on
    assert operators.count("LSTMTraining") == 4 and operators.count("LSTMGrad") == 4, operators
    assert "SliceGrad" in operators, operators


def bidirectional_node(op_type: str, layout: int, lengths: bool = False, **attributes: Any) -> onnx.ModelProto:
    """One bidirectional node with initial states, all outputs graph outputs."""
    states = ["h0", "c0"] if op_type == "LSTM" else ["h0"]
    outputs = ["Y", "Y_h", "Y_c"] if op_type == "LSTM" else ["Y", "Y_h"]
    inputs = ["X", "W", "R", "B", "lengths" if lengths else "", *states]
    node = helper.make_node(
        op_type, inputs, outputs, name="rnn", direction="bidirectional", hidden_size=3, layout=layout, **attributes
    )
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(name, TensorProto.INT32 if name == "lengths" else TensorProto.FLOAT, None)
         for name in inputs if name],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)  # ORT 1.19 reads <= 10


@pytest.mark.parametrize("layout", [0, 1], ids=["time-major", "batch-major"])
@pytest.mark.parametrize(
    ("op_type", "attributes"),
    [
        ("LSTM", {"clip": 0.7, "input_forget": 1}),
        ("GRU", {"activations": ["Sigmoid", "Tanh", "HardSigmoid", "Softsign"], "linear_before_reset": 1}),
    ],
    ids=["lstm", "gru"],
)
def test_split_computes_the_bidirectional_node(op_type: str, attributes: dict[str, Any], layout: int) -> None:
    model = bidirectional_node(op_type, layout, **attributes)
    split = onnx.ModelProto()
    split.CopyFrom(model)
    assert split_bidirectional_rnns(split) == 1 and split_bidirectional_rnns(split) == 0
    assert [node.op_type for node in split.graph.node].count(op_type) == 2
    rng = np.random.default_rng(0)
    gates, (sequence, batch) = 4 if op_type == "LSTM" else 3, (5, 2)
    feeds = {
        "X": rng.standard_normal((batch, sequence, 4) if layout else (sequence, batch, 4)),
        "W": rng.standard_normal((2, gates * 3, 4)),
        "R": rng.standard_normal((2, gates * 3, 3)),
        "B": rng.standard_normal((2, 2 * gates * 3)),
        "h0": rng.standard_normal((batch, 2, 3) if layout else (2, batch, 3)),
        "c0": rng.standard_normal((batch, 2, 3) if layout else (2, batch, 3)),
    }
    feeds = {name: value.astype(np.float32) for name, value in feeds.items() if name in model.graph.node[0].input}
    wanted, got = run(model, feeds, layout), run(split, feeds, layout)
    assert len(got) == len(wanted)
    for value, want in zip(got, wanted, strict=True):
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], layout: int) -> list[np.ndarray]:
    """ORT's results; ONNX's reference ones for layout=1, which ORT does not run (the reference ignores
    ``activations``)."""
    if layout:
        return ReferenceEvaluator(model).run(None, feeds)
    return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_variable_lengths_are_left_alone() -> None:
    model = bidirectional_node("LSTM", 0, lengths=True)
    assert split_bidirectional_rnns(model) == 0 and len(model.graph.node) == 1
