"""ORT's backward graph runs once per forward call, and its gradients are not differentiable.

ORT keeps a forward call's activations in a C++ run state that its backward run consumes: the run
frees them as it goes and leaves its outputs in the state, so ORT 1.19.2 refuses to run the same
state again, and ``_training_manager`` deletes it after the first backward. A second backward through
one forward (``backward(retain_graph=True)`` twice, ``torch.autograd.grad(..., retain_graph=True)`` or
a gradient penalty followed by ``backward()``) then failed with ``AttributeError: '_RunStateInfo'
object has no attribute 'state'``.

Under ``create_graph=True`` (gradient penalties, double backward) the gradients ORT returns were
plain tensors without a history: the penalty built from them trained as if its gradient were zero,
silently. They now carry a node that raises :class:`ORTUnsupportedModelError` when differentiated.

ORT marks its outputs that need no gradient one ``mark_non_differentiable`` call each, and each call
replaces the last one's: with two or more such outputs (two slices of an input, two detached
activations) the others got a gradient in backward, and ORT's assertion failed. They are marked
together.

A gradient hook or ``retain_grad()`` on an output that other outputs are computed from is refused in
backward (unused_outputs.py).

The run states whose backward has not run yet are also tracked (:func:`backward_pending`): building
new graphs while one is pending (a forward in eval mode, then one in train mode, one loss over both)
made the pending backward run on freed state, and the process died with SIGSEGV.
"""

from __future__ import annotations

import collections
import functools
import weakref
from typing import Any

import torch
from torch.utils import _pytree

from lightning_ort.engine.runtime.unused_outputs import drop_unused_gradients, hooked_inner_output
from lightning_ort.errors import ORTUnsupportedModelError

_FIX = (
    "keep `{name}` out of ORT (ORTStrategy(modules=[...]) naming only other submodules) or train with strategy='auto'"
)
SECOND_BACKWARD = (
    "lightning_ort: ORT cannot run the backward pass of `{name}` a second time for one forward call "
    "(backward(retain_graph=True) followed by another backward, torch.autograd.grad(..., retain_graph=True "
    "or create_graph=True) followed by backward(), a gradient penalty): ORT frees the forward's saved "
    "activations in its first backward. Fix: " + _FIX + "; or add the losses and call backward once, or run "
    "the module's forward again for each backward."
)
DOUBLE_BACKWARD = (
    "lightning_ort: ORT cannot differentiate the backward pass of `{name}` again (create_graph=True: a "
    "gradient penalty such as WGAN-GP or R1, double backward, Hessian-vector products): the gradients "
    "ORT computes are not differentiable by PyTorch. Fix: " + _FIX + "."
)


HOOKED_OUTPUT = (
    "lightning_ort: output {index} of `{name}` has a gradient hook or retain_grad(), and other outputs are computed "
    "from it inside ORT's graph: the hook would see only the gradient of its own uses, not the part ORT adds "
    "inside the graph, which eager includes. Fix: hook an output no other output is computed from, or " + _FIX + "."
)
_PENDING_ATTR = "_lightning_ort_pending_runs"
_OUTPUTS_ATTR = "_lightning_ort_outputs"
_MAX_NOTED = 8  # forwards whose outputs wait for a backward (several forwards, one loss)


class _NotDifferentiable(torch.autograd.Function):
    """Passes gradients through unchanged; differentiating the result raises ``message``."""

    @staticmethod
    def forward(ctx: Any, message: str, anchor: torch.Tensor, *grads: torch.Tensor | None) -> Any:
        ctx.message = message
        # clones: an output that is an input would be a view, which optimizers may not change in place
        return tuple(None if grad is None else grad.clone() for grad in grads)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        raise ORTUnsupportedModelError(ctx.message)


def _module_name(manager: Any) -> str:
    module = manager._original_module
    owner = getattr(module, "_owner", module)  # lightning_ort's ForwardAdapter runs its owner's forward
    return type(owner).__name__


def _checked_backward(original: Any, manager: Any) -> Any:
    @functools.wraps(original)
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        if ctx.run_info is not None and not hasattr(ctx.run_info, "state"):
            raise ORTUnsupportedModelError(SECOND_BACKWARD.format(name=_module_name(manager)))
        noted = manager.__dict__.get(_OUTPUTS_ATTR, {}).pop(id(ctx), {})
        outputs = [noted.get(index) for index in range(len(grad_outputs))]
        hooked = hooked_inner_output(manager, outputs, grad_outputs)
        if hooked is not None:
            raise ORTUnsupportedModelError(HOOKED_OUTPUT.format(name=_module_name(manager), index=hooked))
        grads = drop_unused_gradients(manager, grad_outputs, original(ctx, *grad_outputs))
        # autograd runs a Function's backward with grad mode on exactly when create_graph=True
        if not torch.is_grad_enabled() or all(grad is None for grad in grads):
            return grads
        anchor = torch.zeros((), requires_grad=True)
        return _NotDifferentiable.apply(DOUBLE_BACKWARD.format(name=_module_name(manager)), anchor, *grads)

    return backward


def _tracked_forward(original: Any, pending: weakref.WeakSet[Any], manager: Any) -> Any:
    @functools.wraps(original)
    def forward(ctx: Any, *inputs: Any) -> Any:
        outputs = original(ctx, *inputs)
        constant = manager._graph_info.output_grad_indices_non_differentiable
        if len(constant) > 1:  # ORT marks them one call each, and each call replaces the last one's
            ctx.mark_non_differentiable(*(outputs[index] for index in constant))
        if getattr(ctx, "run_info", None) is not None:
            pending.add(ctx.run_info)  # lives as long as the autograd graph that can still run backward
        return outputs

    return forward


def _noted_outputs(original: Any) -> Any:
    """``TrainingManager.forward``, noting the tensors the caller gets by their backward node, for the
    backward's hook check (weak references do not do: the caller's tensors usually die before backward runs,
    their hooks living on in the node). Kept until that backward, or for the last few forwards without one."""

    @functools.wraps(original)
    def forward(self: Any, *inputs: Any, **kwargs: Any) -> Any:
        outputs = original(self, *inputs, **kwargs)
        noted: collections.OrderedDict[int, dict[int, torch.Tensor]] = self.__dict__.setdefault(
            _OUTPUTS_ATTR, collections.OrderedDict()
        )
        this_call: dict[int, dict[int, torch.Tensor]] = {}
        for leaf in _pytree.tree_leaves(outputs):
            node = getattr(leaf, "grad_fn", None) if isinstance(leaf, torch.Tensor) else None
            if node is not None and hasattr(node, "run_info"):
                this_call.setdefault(id(node), {})[leaf.output_nr] = leaf
        noted.update(this_call)  # over what a freed node at the same address left
        while len(noted) > _MAX_NOTED:
            noted.popitem(last=False)
        return outputs

    return forward


def backward_pending(manager: Any) -> bool:
    """Whether a forward run of ORT's training ``manager`` still awaits its backward run.

    The outputs noted for the hook check keep their forward's graph alive: an output nothing else holds
    (``model.eval(); model(x).sum().item()`` in a callback, with gradients on) would have left its run
    pending for good, and every later call with other modes or inputs ran in PyTorch. Those notes are
    dropped here; the outputs someone still holds are kept."""
    pending = getattr(manager, _PENDING_ATTR, ())
    if not any(hasattr(run_info, "state") for run_info in pending):
        return False
    noted = manager.__dict__.get(_OUTPUTS_ATTR)
    if noted:
        weak = {
            node: {index: weakref.ref(output) for index, output in outputs.items()} for node, outputs in noted.items()
        }
        noted.clear()
        for node, references in weak.items():
            alive = {index: output for index, reference in references.items() if (output := reference()) is not None}
            if alive:
                noted[node] = alive
    return any(hasattr(run_info, "state") for run_info in pending)


def install() -> None:
    """Check every ORT training backward run: a second run per forward, and create_graph=True; track
    the forward runs whose backward has not run."""
    from onnxruntime.training.ortmodule._training_manager import TrainingManager

    original = TrainingManager._create_autofunction_class

    @functools.wraps(original)
    def _create_autofunction_class(self: Any) -> Any:
        function = original(self)
        pending = getattr(self, _PENDING_ATTR, None)
        if pending is None:
            pending = weakref.WeakSet()
            setattr(self, _PENDING_ATTR, pending)
        function.forward = staticmethod(_tracked_forward(function.forward, pending, self))
        function.backward = staticmethod(_checked_backward(function.backward, self))
        return function

    TrainingManager._create_autofunction_class = _create_autofunction_class  # type: ignore[method-assign]
    TrainingManager.forward = _noted_outputs(TrainingManager.forward)  # type: ignore[method-assign]
