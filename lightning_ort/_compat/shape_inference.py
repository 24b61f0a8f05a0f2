"""ORT's symbolic shape inference, without the dimensions it only assumed (no wrong broadcast gradients).

ORTModule annotates the exported graph with ORT's Python symbolic shape inference, run with
``auto_merge=True``: where two different symbolic dimensions meet in a broadcast (or an op needs them
equal), it takes them to be the same. ORT's gradient builder then reads the shapes of a broadcasting
node's operands: equal symbols mean "no broadcast, nothing to sum back", and even different symbols
are taken to match. When one of them is 1 at run time the gradient is not reduced: silently wrong
training. A squeeze-and-excitation gate does exactly this, ``x * sigmoid(conv(adaptive_avg_pool2d(x,
1)))`` (torchvision's MobileNetV3 and EfficientNet): the pool's output sizes are new symbols, merged
with the feature map's height and width.

Here every dimension the inference merged or broadcast against a different one is made unknown in
the graph's annotations. ORT's gradient builder then computes the broadcast at run time
(``BroadcastGradientArgs``), which is always right, and dimensions that no assumption touched keep
their static handling.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference, is_literal


class _RecordingInference(SymbolicShapeInference):  # type: ignore[misc]
    """ORT's inference, recording the symbols it assumed equal to another dimension."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.assumed: set[str] = set()

    def _add_suggested_merge(self, symbols: Any, apply: bool = False) -> Any:
        self.assumed.update(str(symbol) for symbol in symbols if not is_literal(symbol))
        return super()._add_suggested_merge(symbols, apply)

    def _broadcast_shapes(self, shape1: list[Any], shape2: list[Any]) -> list[Any]:
        for dim1, dim2 in zip(reversed(shape1), reversed(shape2), strict=False):  # ranks may differ
            if dim1 != dim2 and 1 not in (dim1, dim2):
                self.assumed.update(str(dim) for dim in (dim1, dim2) if not is_literal(dim))
        return super()._broadcast_shapes(shape1, shape2)


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """What ORTModule's ``_infer_shapes`` returns, less the assumed dimensions (unknown instead).

    Raises what ORT's inference raises when it cannot complete."""
    inference = _RecordingInference(2**31 - 1, True, True, 0)  # int_max, auto_merge, guess_output_rank, verbose
    inference._preprocess(model)
    complete = False
    while inference.run_:
        complete = inference._infer_impl()
    inference._update_output_from_vi()
    if not complete:
        raise RuntimeError("ORT's symbolic shape inference could not complete")
    assumed = set(inference.assumed)
    for symbol in inference.assumed:
        merged_into = inference.suggested_merge_.get(symbol)
        if merged_into is not None and not is_literal(merged_into):
            assumed.add(str(merged_into))
    annotated = inference.out_mp_
    for info in annotated.graph.value_info:
        for dim in info.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in assumed:
                dim.Clear()
    return annotated
