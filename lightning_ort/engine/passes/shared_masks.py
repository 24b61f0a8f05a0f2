"""One ``NonZero`` per boolean mask in an exported graph.

``c[mask] - a[mask]`` (a box loss over the foreground locations, torchvision's
``generalized_box_iou_loss``) is exported with a ``NonZero`` of the mask per indexing. ORT's shape
inference gives each its own size, so the gradient of the subtraction broadcasts between two sizes
ORT cannot tell equal, and when the mask was all False (an image without objects) its
``BroadcastGradientArgs`` failed an assertion and aborted the process in backward. Before shape
inference, the later ``NonZero`` nodes of one tensor are dropped and their users read the first's
indices, so both selections have one size.
"""

from __future__ import annotations

import onnx

from lightning_ort.engine.passes.graph_rewrite import has_subgraphs


def share_mask_indices(model: onnx.ModelProto) -> int:
    """Drop every ``NonZero`` of a tensor an earlier one already took (in place); how many."""
    graph = model.graph
    if has_subgraphs(graph):
        return 0
    outputs = {output.name for output in graph.output}
    first: dict[str, str] = {}  # the tensor -> its first NonZero's output
    renamed: dict[str, str] = {}
    kept = []
    for node in graph.node:
        if node.op_type == "NonZero" and node.domain in ("", "ai.onnx") and node.output[0] not in outputs:
            if node.input[0] in first:
                renamed[node.output[0]] = first[node.input[0]]
                continue
            first[node.input[0]] = node.output[0]
        kept.append(node)
    if not renamed:
        return 0
    for node in kept:
        for index, name in enumerate(node.input):
            if name in renamed:
                node.input[index] = renamed[name]
    del graph.node[:]
    graph.node.extend(kept)
    values = [info for info in graph.value_info if info.name not in renamed]
    del graph.value_info[:]
    graph.value_info.extend(values)
    return len(renamed)
