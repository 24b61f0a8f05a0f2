"""op_rewrites: convolutions, linear layers, GELU, ReLU and LayerNorm on torch's kernels, constant
selects as Slice.

Each family trains through ORT with the rewrites (the CPU default) and is compared with eager
PyTorch, weights and buffers included; the exported graph shows that the rewritten forms ran.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_losses_match, assert_ort_ran, assert_states_match, fit_both
from models import Base
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning_ort
from lightning_ort import engine

STEPS = 6


def image_loader(channels: int = 3, size: int = 12) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    images = torch.randn(48, channels, size, size, generator=g)
    return DataLoader(TensorDataset(images, torch.randint(0, 4, (48,), generator=g)), 8)


class Classifier(Base):
    """Trained and validated with cross-entropy on ``(inputs, labels)`` batches."""

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return F.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", F.cross_entropy(self(batch[0]), batch[1]))


class ConvNet(Classifier):
    def __init__(self, body: nn.Module, features: int) -> None:
        super().__init__()
        self.body = body
        self.head = nn.Linear(features, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).flatten(1))


def conv_bn(bias: bool) -> ConvNet:
    body = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=bias),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, dilation=1, groups=2, bias=bias),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(2),
    )
    return ConvNet(body, 32)


def transposed_and_dilated() -> ConvNet:
    body = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=2, dilation=2),
        nn.ReLU(),
        nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
    )
    return ConvNet(body, 16)


def string_padding() -> ConvNet:
    body = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding="same"),
        nn.ReLU(),
        nn.Conv2d(6, 6, 3, padding="same", dilation=2, bias=False),
        nn.Conv2d(6, 4, (3, 5), padding="valid"),
        nn.AdaptiveAvgPool2d(2),
    )
    return ConvNet(body, 16)


def frozen_stem() -> ConvNet:
    """Fine-tuning: the first convolution is frozen, so the layers after it get inputs needing no gradient."""
    model = conv_bn(bias=True)
    model.body[0].requires_grad_(False)
    return model


def frozen_middle() -> ConvNet:
    """The middle convolution and BatchNorm are frozen while the layers around them train."""
    model = conv_bn(bias=False)
    model.body[1].requires_grad_(False)
    model.body[3].requires_grad_(False)
    return model


def bias_only() -> ConvNet:
    """Bias-only fine-tuning (BitFit): every weight frozen, the biases train."""
    model = conv_bn(bias=True)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.endswith("bias"))
    return model


def non_affine_bn() -> ConvNet:
    body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8, affine=False), nn.ReLU(), nn.AdaptiveAvgPool2d(2))
    return ConvNet(body, 32)


class UnfreezeStem(ConvNet):
    """Trains the head first, then unfreezes the whole network (ORT rebuilds its gradient graph)."""

    def __init__(self) -> None:
        model = conv_bn(bias=True)
        super().__init__(model.body, 32)
        self.head = model.head
        self.body.requires_grad_(False)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.global_step == 3:
            self.body.requires_grad_(True)


class Conv1dNet(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(8, 8, 5, padding=2)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.conv(x.transpose(1, 2))).mean(-1))


def sequence_loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(48, 10, 8, generator=g), torch.randint(0, 3, (48,), generator=g)), 8)


class GraphRecorder(L.Callback):
    """Keeps the ONNX training graph ORT exported for the LightningModule's forward."""

    def __init__(self) -> None:
        self.nodes: list[tuple[str, str]] = []
        self.gathered: list[str] = []  # op types of what each Gather node gathers from

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if not self.nodes and isinstance(trainer.strategy, lightning_ort.ORTStrategy):
            model = engine.exported_model(trainer.strategy.ort_modules["forward"], training=True)
            self.nodes = [(node.op_type, _operator(node)) for node in model.graph.node]
            producers = {output: node.op_type for node in model.graph.node for output in node.output}
            self.gathered = [
                producers.get(node.input[0], "input") for node in model.graph.node if node.op_type == "Gather"
            ]


def _operator(node: Any) -> str:
    return next((attribute.s.decode() for attribute in node.attribute if attribute.name == "operator"), "")


def _fit_with_graph(make_model: Any, loader: Any, **strategy: Any) -> tuple[Any, Any, GraphRecorder]:
    """Train eagerly and through ORT, validating too (ORT's inference graph gets the rewrites as well)."""
    recorder = GraphRecorder()
    strategy_object = lightning_ort.ORTStrategy(**strategy)
    eager, ort = fit_both(
        make_model, loader, STEPS, strategy=strategy_object, callbacks=[recorder], val=loader(), val_check_interval=3
    )
    return eager, ort, recorder


@pytest.mark.parametrize(
    "make_model",
    [
        lambda: conv_bn(bias=False),
        lambda: conv_bn(bias=True),
        transposed_and_dilated,
        string_padding,
        frozen_stem,
        frozen_middle,
        bias_only,
        non_affine_bn,
        UnfreezeStem,
    ],
    ids=[
        "conv-bn",
        "conv-bias-bn",
        "transposed-dilated",
        "string-padding",
        "frozen-stem",
        "frozen-middle",
        "bias-only",
        "bn-affine-false",
        "unfreeze",
    ],
)
def test_convolutions_run_torch_kernels_and_match_eager(make_model: Any) -> None:
    eager, ort, recorder = _fit_with_graph(make_model, image_loader)
    assert_ort_ran(ort, STEPS)
    operators = [operator for op_type, operator in recorder.nodes if op_type == "ATen"]
    assert any(operator.startswith("lightning_ort::convolution") for operator in operators), operators
    assert not any(op_type in ("Conv", "ConvTranspose") for op_type, _ in recorder.nodes)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def even_same_padding() -> ConvNet:
    """Even kernels with padding="same": torch pads one more at the end (asymmetric padding)."""
    body = nn.Sequential(
        nn.Conv2d(3, 6, 4, padding="same"),
        nn.ReLU(),
        nn.Conv2d(6, 4, (2, 3), padding="same", dilation=(1, 2)),
        nn.AdaptiveAvgPool2d(2),
    )
    return ConvNet(body, 16)


@pytest.mark.parametrize("rewrites", [True, False], ids=["rewrites", "ort-conv"])
def test_string_padding_trains_like_eager_with_and_without_rewrites(rewrites: bool) -> None:
    """ORT's own Conv with auto_pad computed wrong gradients for asymmetric "same" padding; the
    export makes the padding explicit (conv_padding.py)."""
    for make_model in (string_padding, even_same_padding):
        eager, ort, _ = _fit_with_graph(make_model, image_loader, op_rewrites=rewrites)
        assert_ort_ran(ort, STEPS)
        assert_losses_match(eager, ort)
        assert_states_match(eager, ort)


def test_conv1d_and_relu_rewrite_match_eager() -> None:
    eager, ort, recorder = _fit_with_graph(Conv1dNet, sequence_loader)
    assert_ort_ran(ort, STEPS)
    assert "Relu" not in [op_type for op_type, _ in recorder.nodes]
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class SequenceNet(Classifier):
    """Linear layers on [batch, time, features] inputs (with and without bias), LayerNorm, GELU, ReLU."""

    def __init__(self, approximate: str = "none", affine: bool = True) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16, elementwise_affine=affine)
        self.mixer = nn.Linear(16, 16, bias=False)
        self.head = nn.Linear(16, 3)
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.norm(self.embed(x)), approximate=self.approximate)
        return self.head(F.relu(self.mixer(h)).mean(1))


def frozen_embedding() -> SequenceNet:
    """The first layer is frozen: the layers after it get inputs needing no gradient."""
    model = SequenceNet()
    model.embed.requires_grad_(False)
    return model


def sequence_bias_only() -> SequenceNet:
    model = SequenceNet()
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.endswith("bias"))
    return model


def frozen_norm() -> SequenceNet:
    model = SequenceNet(approximate="tanh")
    model.norm.requires_grad_(False)
    return model


@pytest.mark.parametrize(
    "make_model",
    [SequenceNet, lambda: SequenceNet("tanh", affine=False), frozen_embedding, sequence_bias_only, frozen_norm],
    ids=["linear-norm-gelu", "tanh-non-affine", "frozen-first", "bias-only", "frozen-norm"],
)
def test_linear_norm_and_activations_run_torch_kernels_and_match_eager(make_model: Any) -> None:
    eager, ort, recorder = _fit_with_graph(make_model, sequence_loader)
    assert_ort_ran(ort, STEPS)
    operators = {operator.removeprefix("lightning_ort::") for op_type, operator in recorder.nodes if op_type == "ATen"}
    assert {"linear", "linear_bias", "layer_norm", "gelu", "relu"} <= operators, operators
    op_types = {op_type for op_type, _ in recorder.nodes}
    assert not op_types & {"Gemm", "MatMul", "LayerNormalization", "Erf", "Gelu", "Relu"}, op_types
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class WeightVector(Classifier):
    """``F.linear`` with a weight vector (in_features,): a score per position, its last dimension dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.score = nn.Parameter(torch.randn(8))
        self.score_bias = nn.Parameter(torch.zeros(()))
        self.gate = nn.Parameter(torch.randn(8))
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(F.linear(x, self.score, self.score_bias), dim=1) * torch.sigmoid(F.linear(x, self.gate))
        return self.head((x * weights.unsqueeze(-1)).sum(1))


def test_linear_with_a_weight_vector_matches_eager() -> None:
    """ORT's own MatMul gradient fails on a vector operand; the export keeps such a linear trainable."""
    eager, ort, recorder = _fit_with_graph(WeightVector, sequence_loader)
    assert_ort_ran(ort, STEPS)
    assert ("ATen", "lightning_ort::linear") in recorder.nodes
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class MaskedRelu(Classifier):
    """ReLU of -inf (masked scores): 0 in eager PyTorch, and so through ORT."""

    def __init__(self) -> None:
        super().__init__()
        self.score = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.score(x).masked_fill(x > 1.0, float("-inf"))
        return self.head(F.relu(scores).mean(1))


def test_relu_of_minus_infinity_is_zero_as_in_eager() -> None:
    eager, ort, _ = _fit_with_graph(MaskedRelu, sequence_loader)
    assert_ort_ran(ort, STEPS)
    assert all(torch.isfinite(torch.tensor(ort.losses)))
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_rewrites_off_uses_ort_kernels_and_still_matches() -> None:
    eager, ort, recorder = _fit_with_graph(lambda: conv_bn(bias=True), image_loader, op_rewrites=False)
    assert_ort_ran(ort, STEPS)
    op_types = [op_type for op_type, _ in recorder.nodes]
    assert {"Conv", "Relu", "Gemm"} <= set(op_types)
    kernels = ("lightning_ort::convolution", "lightning_ort::linear", "lightning_ort::relu")
    assert not any(operator.startswith(kernels) for _, operator in recorder.nodes)
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class ClsPooling(Classifier):
    """Takes the first token (``x[:, 0]``), like BERT-style classifiers, after self-attention."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(40, 16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        x = x + self.attn(x, x, x, need_weights=False)[0]
        return self.head(x[:, 0] - x[:, -1])


def token_loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    ids, labels = torch.randint(0, 40, (48, 7), generator=g), torch.randint(0, 3, (48,), generator=g)
    return DataLoader(TensorDataset(ids, labels), 8)


def test_constant_select_becomes_slice_and_matches_eager() -> None:
    eager, ort, recorder = _fit_with_graph(ClsPooling, token_loader)
    assert_ort_ran(ort, STEPS)
    assert "Slice" in [op_type for op_type, _ in recorder.nodes]
    # what is left are index lookups in shape tensors, never a Gather of activations (GatherGrad)
    assert set(recorder.gathered) <= {"Shape"}, recorder.gathered
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


def test_exports_after_training_are_standard_onnx(tmp_path: Any) -> None:
    """The rewrites apply to ORT's own export only; a user's export afterwards gets plain Conv/Relu."""
    _fit_with_graph(lambda: conv_bn(bias=True), image_loader)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    path = tmp_path / "plain.onnx"
    torch.onnx.export(model, (torch.randn(1, 3, 8, 8),), str(path), dynamo=False)
    import onnx

    op_types = {node.op_type for node in onnx.load(str(path)).graph.node}
    assert {"Conv", "Relu"} <= op_types and "ATen" not in op_types


def test_bad_op_rewrites_value_is_refused() -> None:
    with pytest.raises(TypeError, match=r"op_rewrites='yes'.*True, False or None"):
        lightning_ort.ORTStrategy(op_rewrites="yes")  # type: ignore[arg-type]


class AttentionNet(Classifier):
    """Attention without dropout in the forms users have: an encoder layer with a padding mask, a
    causal mask, cross-attention to a frozen memory, an explicit scale, a learned additive bias
    (its mask needs a gradient), heads that are no transpose of the input (a plain reshape), a
    sequence-first encoder layer (torch's default layout) and a decoder layer (causal self-attention,
    cross-attention with a memory padding mask)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.embed = nn.Embedding(40, 16)
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.memory = nn.Embedding(40, 16).requires_grad_(False)
        self.cross = nn.MultiheadAttention(16, 2, batch_first=True)
        self.bias = nn.Parameter(torch.zeros(2, 7, 7))
        self.sequence_first = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0)
        self.decoder = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        if self.kind == "sequence-first":
            x = self.sequence_first(x.transpose(0, 1), src_key_padding_mask=ids == 0).transpose(0, 1)
        elif self.kind == "decoder":
            mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
            memory = self.memory(ids.flip(1))
            x = self.decoder(x, memory, tgt_mask=mask, tgt_is_causal=True, memory_key_padding_mask=ids.flip(1) == 0)
        elif self.kind == "padding":
            x = self.layer(x, src_key_padding_mask=ids == 0)
        elif self.kind == "causal":
            mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
            x = self.layer(x, src_mask=mask, is_causal=True)
        elif self.kind == "cross":
            memory = self.memory(ids.flip(1))
            x = x + self.cross(x, memory, memory, need_weights=False)[0]
        elif self.kind == "scaled-causal":
            q = x.unflatten(-1, (2, 8)).transpose(1, 2)
            x = F.scaled_dot_product_attention(q, q, q, is_causal=True, scale=0.3).transpose(1, 2).flatten(2)
        elif self.kind == "learned-bias":
            q = x.unflatten(-1, (2, 8)).transpose(1, 2)
            x = F.scaled_dot_product_attention(q, q, q, attn_mask=self.bias).transpose(1, 2).flatten(2)
        else:  # heads from a reshape
            q = x.reshape(x.shape[0], 2, -1, 8)
            x = F.scaled_dot_product_attention(q, q, q, is_causal=True).reshape(x.shape)
        return self.head(x.mean(1))


def padded_token_loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 40, (48, 7), generator=g)
    ids[::2, -3:] = 0  # padding at the end of every other sequence
    return DataLoader(TensorDataset(ids, torch.randint(0, 3, (48,), generator=g)), 8)


@pytest.mark.parametrize(
    "kind",
    ["padding", "causal", "cross", "scaled-causal", "learned-bias", "reshaped-heads", "sequence-first", "decoder"],
)
def test_attention_runs_torch_kernels_and_matches_eager(kind: str) -> None:
    eager, ort, recorder = _fit_with_graph(lambda: AttentionNet(kind), padded_token_loader)
    assert_ort_ran(ort, STEPS)
    operators = [operator for op_type, operator in recorder.nodes if op_type == "ATen"]
    assert "lightning_ort::attention" in operators
    op_types = {op_type for op_type, _ in recorder.nodes}
    assert "Softmax" not in op_types
    if kind != "sequence-first":  # there the model transposes its input and output itself
        # the heads' transpose(1, 2) and nn.MultiheadAttention's batch_first transposes are views of
        # the attention operator, not ORT copies
        assert "Transpose" not in op_types
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class SpelledOutAttention(Classifier):
    """Attention written out as the GPT example does (matmul with the key transposed, a causal
    ``masked_fill``, softmax, matmul with the values), then a broadcast matmul with a parameter.
    Kinds: ``causal``; ``frozen-query`` and ``frozen-value`` (from a frozen embedding: one side of
    a matmul needs no gradient); ``linear-attention`` (the transposed tensor on the left, softmax over dim -2);
    ``float-softmax`` (a softmax that casts, left to ORT)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.embed = nn.Embedding(40, 16)
        self.qkv = nn.Linear(16, 48)
        self.mix = nn.Parameter(torch.randn(16, 16) * 0.2)
        self.frozen = nn.Embedding(40, 16).requires_grad_(False)
        self.head = nn.Linear(16, 3)
        self.register_buffer("causal", torch.tril(torch.ones(7, 7, dtype=torch.bool)), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        batch, length = ids.shape
        heads = self.qkv(self.embed(ids)).view(batch, length, 3, 2, 8).permute(2, 0, 3, 1, 4)
        q, k, v = heads[0], heads[1], heads[2]
        frozen = self.frozen(ids).view(batch, length, 2, 8).transpose(1, 2)
        if self.kind == "frozen-query":
            q = frozen
        if self.kind == "frozen-value":
            v = frozen
        if self.kind == "linear-attention":
            y = q.softmax(-1) @ (k.softmax(-2).transpose(-2, -1) @ v)
        else:
            scores = (q @ k.transpose(-2, -1)) * 8**-0.5
            scores = scores.masked_fill(~self.causal[:length, :length], float("-inf"))
            dtype = torch.float32 if self.kind == "float-softmax" else None
            y = F.softmax(scores, dim=-1, dtype=dtype) @ v
        y = y.transpose(1, 2).reshape(batch, length, 16) @ self.mix
        return self.head(y.mean(1))


@pytest.mark.parametrize("kind", ["causal", "frozen-query", "frozen-value", "linear-attention", "float-softmax"])
def test_spelled_out_attention_runs_torch_kernels_and_matches_eager(kind: str) -> None:
    eager, ort, recorder = _fit_with_graph(lambda: SpelledOutAttention(kind), padded_token_loader)
    assert_ort_ran(ort, STEPS)
    operators = {operator for op_type, operator in recorder.nodes if op_type == "ATen"}
    op_types = {op_type for op_type, _ in recorder.nodes}
    assert "lightning_ort::matmul" in operators
    assert "MatMul" not in op_types
    if kind != "linear-attention":
        assert "lightning_ort::masked_fill" in operators
        assert "Where" not in op_types
    if kind == "float-softmax":
        assert "Softmax" in op_types
    else:
        assert "lightning_ort::softmax" in operators
        assert "Softmax" not in op_types
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class DetachedFeatures(Classifier):
    """A head trained on detached features (stop-gradient, as in BYOL or a probe) beside the main
    path: the head's linear layer and matmul must not compute a gradient for their input."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.probe = nn.Linear(16, 3)
        self.mix = nn.Parameter(torch.randn(16, 3) * 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = torch.relu(self.body(x))
        probed = self.probe(features.detach()) + features.detach() @ self.mix
        return probed.mean(1) + features.mean()


def test_layers_on_detached_features_match_eager() -> None:
    eager, ort, recorder = _fit_with_graph(DetachedFeatures, sequence_loader)
    assert_ort_ran(ort, STEPS)
    operators = {operator for op_type, operator in recorder.nodes if op_type == "ATen"}
    assert {"lightning_ort::linear_bias", "lightning_ort::matmul", "detach_copy"} <= operators
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)


class BroadcastMaskedFill(Classifier):
    """``masked_fill`` whose mask is larger than the tensor filled: the result is broadcast and the
    gradient must be summed back to the tensor's shape."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 16)
        self.gate = nn.Linear(8, 1)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        gated = self.gate(x).masked_fill(h.detach() > 0, 0.5)  # [B, T, 1] filled by a [B, T, 16] mask
        return self.head((h * gated).mean(1))


def test_broadcast_masked_fill_sums_its_gradient_like_eager() -> None:
    eager, ort, recorder = _fit_with_graph(BroadcastMaskedFill, sequence_loader)
    assert_ort_ran(ort, STEPS)
    assert "lightning_ort::masked_fill" in {operator for _, operator in recorder.nodes}
    assert_losses_match(eager, ort)
    assert_states_match(eager, ort)
