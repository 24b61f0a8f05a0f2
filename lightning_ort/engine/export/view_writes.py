"""In-place changes of views inside a traced forward, which torch's ONNX export drops.

torch's TorchScript export carries an in-place change of a view back to the viewed tensor only when
the indexing and the change are one Python expression (``h[:, :4] += 1``, ``h[:, 0].mul_(2)``): it
pairs them by their position in the source. A view kept in a variable and changed in a later
statement (``v = h[:, :4]`` then ``v.mul_(2)``, ``v += 1``, ``F.relu(v, inplace=True)``,
``v[:, 0] = 1``), and every change through another kind of view (``m.diagonal().add_(1)``,
``h.transpose(1, 2).add_(1)``, ``h.view(-1)[:5].zero_()``, ``eye.diagonal().fill_(1)``) left the
graph without the change: silently wrong training (weights 0.03-0.23 off after five steps).

:class:`ViewWrites` sees these calls while the export traces. A view made by indexing (of a tensor
that is no view, or of such views in turn) is changed on a copy, which one indexing assignment writes
back into the viewed tensor (the form the export carries), and the view's trace value becomes the
copy's. A change through any other view is refused with the fix.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from lightning_ort.engine.export.value_traces import value_trace

_IN_PLACE_OPERATORS = frozenset(
    {
        "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__", "__imatmul__",
        "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__setitem__",
    }
)  # fmt: skip
VIEW_CHANGE = (
    " (v = h.diagonal() or h.transpose(1, 2), then v.add_(1)); torch's ONNX export drops a change made through "
    "such a view, so ORT would train without it. Fix: compute out of place (h = h + torch.diag_embed(d)), change "
    "the tensor through indexing (h[:, :4] += 1), or keep that module out of ORT with ORTStrategy(modules=[...])"
)


def changes_a_view(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``func`` changes its first argument in place (``mul_``, ``+=``, ``F.relu(v, inplace=True)``)
    and that argument is a view."""
    if not args or not isinstance(args[0], torch.Tensor) or not args[0]._is_view():
        return False
    name = getattr(func, "__name__", "")
    if name in _IN_PLACE_OPERATORS or (name.endswith("_") and not name.endswith("__")):
        return True
    position = _inplace_position(func)
    if position is None:
        return False
    return bool(kwargs.get("inplace", args[position] if len(args) > position else False))


@functools.cache
def _inplace_position(func: Any) -> int | None:
    """The position of ``func``'s ``inplace`` parameter (``F.relu``, ``F.leaky_relu``, ``F.dropout``), if any."""
    try:
        names = list(inspect.signature(func).parameters)
    except (TypeError, ValueError):  # a builtin without a signature
        return None
    return names.index("inplace") if "inplace" in names else None


def _base_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor._base if tensor._base is not None else tensor


class ViewWrites:
    """The views indexing made during one export (:meth:`record`), and their in-place changes (:meth:`change`)."""

    def __init__(self) -> None:
        # id of a view -> the view (kept alive, so that the id stays its own), the viewed tensor, the index
        self._views: dict[int, tuple[torch.Tensor, torch.Tensor, Any]] = {}
        # id of a view of a tensor the forward holds -> the view (kept alive)
        self._held_views: dict[int, torch.Tensor] = {}

    def record(self, func: Any, args: tuple[Any, ...], result: Any) -> None:
        """Note ``result`` if indexing (``h[:, :4]``, ``h[..., 0]``) made it as a view of ``args[0]``, and every
        view a call made of one of its arguments (``h.transpose(1, 2)``, ``h.chunk(2)``)."""
        if getattr(func, "__name__", None) == "__getitem__" and isinstance(result, torch.Tensor) and result._is_view():
            self._views[id(result)] = (result, args[0], args[1])
        results = result if isinstance(result, tuple | list) else (result,)
        bases = {id(_base_of(arg)) for arg in args if isinstance(arg, torch.Tensor)}
        for part in results:
            if isinstance(part, torch.Tensor) and part._is_view() and id(_base_of(part)) in bases:
                self._held_views[id(part)] = part

    def of_held_tensor(self, view: torch.Tensor) -> bool:
        """Whether ``view`` views a tensor the forward holds. ``nn.Linear`` on a 3-D input returns a view of
        its own 2-D product, which nothing else holds: a change of it in place loses nothing."""
        return id(view) in self._held_views or id(view) in self._views

    def writable(self, view: torch.Tensor) -> bool:
        """Whether ``view`` comes, through indexing only, from a tensor that is no view."""
        return id(view) in self._views and not self._root(view)._is_view()

    def change(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``func(*args, **kwargs)`` for a :meth:`writable` view ``args[0]``, made on a copy written back; every
        view of the same tensor is then read again from it (a view that overlaps the changed one sees the change,
        as in eager)."""
        view = args[0]
        if getattr(func, "__name__", "") == "copy_":  # torch cannot export copy_ of a whole tensor (aten::copy)
            source = args[1] if len(args) > 1 else kwargs["src"]
            copy, returned = source.to(view.dtype).expand(view.shape).clone(), view
        else:
            copy = self._fresh(view).clone()
            returned = func(copy, *args[1:], **kwargs)
        root = self._write_back(view, copy)
        for other, _, _ in self._views.values():
            if self._root(other) is root:
                traced = value_trace(self._fresh(other))
                if traced is not None:
                    torch._C._set_value_trace(other, traced)
        return None if returned is None else view

    def _root(self, view: torch.Tensor) -> torch.Tensor:
        while id(view) in self._views:
            view = self._views[id(view)][1]
        return view

    def _fresh(self, view: torch.Tensor) -> torch.Tensor:
        """``view`` indexed again from its root as the trace holds it now."""
        _, base, index = self._views[id(view)]
        return (self._fresh(base) if id(base) in self._views else base)[index]

    def _write_back(self, view: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """Assign ``value`` to ``view``'s place in its root (through each view between); the root."""
        _, base, index = self._views[id(view)]
        if id(base) not in self._views:
            base[index] = value
            return base
        outer = self._fresh(base).clone()
        outer[index] = value
        return self._write_back(base, outer)
