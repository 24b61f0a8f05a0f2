"""Why ORT gave up on a module, in one readable line: the error's text, and what some errors mean and how to
fix them."""

from __future__ import annotations

import re

_COMPLEX = (
    "the forward computes with complex tensors (torch.view_as_complex or torch.polar, as rotary embeddings in "
    "their complex form do), which ORT cannot hold. Fix: rotate with real tensors (x * cos + rotate_half(x) * sin), "
    "or keep that module out of ORT with ORTStrategy(modules=[...])"
)
# What some errors of ORT and of torch's export mean for the user's module, and the fix: (symptom, hint)
HINTS: tuple[tuple[str, str], ...] = (
    (
        "Cannot split using values in 'split' attribute",
        "the forward splits a dimension whose size changed since the export, as x.unbind(1) or x.split(1, dim=1) "
        "over the sequence length do; the exported graph keeps the first batch's number of parts. Fix: use tensor "
        "operations over the whole dimension, or batches of one length",
    ),
    (
        "cond must be a bool, but got a Tensor",
        "a check in torch's Python code compared sizes the export traces as tensors (F.max_unpool2d's output "
        "size check does). Fix: keep that layer out of ORT with ORTStrategy(modules=[...])",
    ),
    (
        "as it's unreachable",
        "ORT found no gradient path from the outputs to a parameter that requires grad, through an op that "
        "carries no gradient. Fix: freeze the parameter with requires_grad_(False), which ORT leaves out, or "
        "register it as a buffer, or keep that part out of ORT with ORTStrategy(modules=[...])",
    ),
    (
        "cannot register a hook on a tensor that doesn't require gradient",
        "the forward registers a gradient hook on a tensor; ORT runs the forward with gradients off to export it, "
        "and computes the gradients of its graph in one piece without calling Python hooks. Fix: register the hook "
        "on a tensor forward returns and nothing inside forward uses, or keep that module out of ORT with "
        "ORTStrategy(modules=[...])",
    ),
    (
        "Cannot insert a Tensor that requires grad as a constant",
        "the forward uses a tensor that requires grad and is neither a parameter nor a buffer of the module ORT "
        "runs (a parameter of another module reached through a closure or a global, one kept in a Python list "
        "or dict); ORT's graph could hold it only as a constant, without its gradient. Fix: make it part of the "
        "module (an nn.Parameter attribute, nn.ParameterList or nn.ParameterDict), or keep that module out of "
        "ORT with ORTStrategy(modules=[...])",
    ),
    (
        "HandleBroadcasting",
        "ORT's gradient builder could not work out the shapes of a broadcast, typically a matmul whose batch "
        "dimensions broadcast against sizes it cannot follow (W(1, N, ...) @ u(B, N, ...)). Fix: expand the "
        "operand first (W.expand(B, -1, ...)), or keep that module out of ORT with ORTStrategy(modules=[...])",
    ),
    ("ComplexFloat is an unexpected tensor scalar type", _COMPLEX),
    ("'aten::polar'", _COMPLEX),
    ("'aten::view_as_complex'", _COMPLEX),
    (
        "Argument types: Tensor, bool",
        "the forward uses a bool in tensor arithmetic (h * flag, a bool argument of forward included), which "
        "torch's export cannot trace. Fix: convert it first (h * float(flag)), or branch on it (if flag: ...)",
    ),
)

# The line naming the exception in a traceback ORT embeds in its own error text
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")


def reason(error: BaseException) -> str:
    """One readable line out of ORT's (often multi-page) error text."""
    root: BaseException = error
    while root.__cause__ is not None:
        root = root.__cause__
    lines = [line.strip() for line in str(root).splitlines() if line.strip()]
    raised = [line for line in lines[1:] if _RAISED.match(line)]
    text = raised[-1] if raised else (lines[-1] if lines else "")
    # ORT's C++ checks read "<file>:<line> <function signature> <condition> was false. <message>"
    _, checked, message = text.partition(" was false. ")
    if checked:
        text = message
    if len(lines) > 1 and lines[0] not in text:
        text = f"{lines[0][:200]} ... {text}"
    return f"{type(root).__name__}: {text[:600]}"


def hints(reason: str) -> str:
    """The hint of every symptom in ``reason``, each in parentheses after a space ("" for none)."""
    return "".join(f" ({hint})" for symptom, hint in HINTS if symptom in reason)
