"""``lightning-ort``: a LightningCLI with ``lightning_ort`` imported, so ``strategy: ort`` works from any config.

The command takes Lightning's subcommands (``fit``, ``validate``, ``test``, ``predict``) with the model
and data given by ``class_path`` (in a ``--config`` file or as ``--model``/``--data``)::

    lightning-ort fit --config examples/cnn_digits/configs/ort.yaml
    lightning-ort fit --model my_project.Model --data my_project.Data --trainer.strategy=ort

and ``lightning-ort setup`` builds ORT's C++ extensions ahead of time (see ``lightning_ort.__main__``).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import lightning.pytorch as pl
from jsonargparse import Namespace
from jsonargparse._actions import _ActionHelpClassPath
from jsonargparse._typehints import ActionTypeHint
from jsonargparse._util import NestedArg, get_import_path
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI
from lightning.pytorch.strategies import Strategy, StrategyRegistry
from typing_extensions import override

import lightning_ort  # noqa: F401  (registers strategy="ort")
from lightning_ort.summary import RunSummary

__all__ = ["ORTLightningCLI", "RunSummary", "main"]

DESCRIPTION = """\
Train, validate, test or predict with a LightningModule and LightningDataModule named by class_path,
through ONNX Runtime with `--trainer.strategy=ort` (lightning_ort is imported, so the string works).
`lightning-ort setup [--verbose]` builds ORT's C++ extensions into the cache instead."""


def _registered_class(name: object) -> dict[str, Any] | None:
    """The ``StrategyRegistry`` entry of a strategy name (``"ort"``, ``"ort_ddp_spawn"``, ``"ddp"``), matched
    as the Trainer matches it (also in lower case); ``None`` for anything else."""
    if not isinstance(name, str):
        return None
    for key in (name, name.lower()):
        if key in StrategyRegistry:
            return StrategyRegistry[key]
    return None


def _registered_class_path(name: object) -> Namespace | None:
    """A registered strategy name as the class path jsonargparse takes (with the entry's ``init_params``)."""
    entry = _registered_class(name)
    if entry is None:
        return None
    strategy = entry["strategy"]
    spec = Namespace(class_path=get_import_path(strategy))
    if entry["init_params"]:
        spec["init_args"] = Namespace(**entry["init_params"])
    return spec


def _sets_options(value: object) -> bool:
    """Whether a value given for ``trainer.strategy`` sets options of the strategy already chosen:
    ``--trainer.strategy.fallback=raise``, ``--trainer.strategy.init_args.fallback=raise``, or a config's
    ``strategy: {init_args: {...}}`` (but not one naming a ``class_path`` of its own)."""
    if isinstance(value, NestedArg):
        return value.key != "class_path"
    return isinstance(value, (dict, Namespace)) and "class_path" not in value


class _StrategyArgument(ActionTypeHint):
    """The Trainer's ``strategy`` argument, where a registered name such as ``ort`` turns into its class
    (``{class_path: lightning_ort.ORTStrategy}``) as soon as an option of the strategy is given after it.

    jsonargparse applies ``--trainer.strategy.fallback=raise`` to the class path given before it; a
    registered name is a plain string to it, so without this the option fails with "Does not validate
    against any of the Union subtypes". A name given alone stays a name (``--print_config`` shows
    ``strategy: ort``)."""

    # jsonargparse passes only the keyword arguments this signature names, so it is spelled out
    def _check_type(self, value: Any, append: bool = False, cfg: Namespace | None = None, mode: Any = None) -> Any:
        spec = _registered_class_path(cfg.get(self.dest)) if cfg is not None and _sets_options(value) else None
        if spec is None:
            return super()._check_type(value, append=append, cfg=cfg, mode=mode)
        assert cfg is not None
        cfg = cfg.clone()
        cfg[self.dest] = spec
        checked = super()._check_type(value, append=append, cfg=cfg, mode=mode)
        if isinstance(checked, Namespace) and "class_path" in checked:  # class_path first, as when given so
            checked = Namespace(class_path=checked.pop("class_path"), **vars(checked))
        return checked


class _StrategyHelp(_ActionHelpClassPath):
    """``--trainer.strategy.help`` that also takes a registered name (``--trainer.strategy.help ort``)."""

    def resolve_help_type(self, value: Any, option_string: str) -> type:
        entry = _registered_class(value)
        return super().resolve_help_type(
            value if entry is None else get_import_path(entry["strategy"]),
            option_string,
        )


STRATEGY_HELP = (
    " With lightning_ort: `ort` (ORTStrategy) or `ort_ddp` (ORTDDPStrategy). Set an option of the strategy"
    " with `--trainer.strategy.fallback=raise` (also after `strategy: ort` in a config); list its options"
    " with `--trainer.strategy.help ORTStrategy`."
)


def _strategy_from_class_path(value: str) -> str | Strategy:
    """``"pkg.module.SomeStrategy"`` (how LightningCLI parses ``--trainer.strategy=pkg.module.SomeStrategy``,
    Lightning issue 19682) as an instance with default arguments; any other string unchanged."""
    if value in StrategyRegistry or "." not in value:
        return value
    module_name, _, name = value.rpartition(".")
    try:
        candidate = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError):
        return value
    if isinstance(candidate, type) and issubclass(candidate, Strategy):
        return candidate()
    return value


class ORTLightningCLI(LightningCLI):
    """``LightningCLI`` for lightning_ort: ``strategy: ort`` is registered, a dotted strategy class given
    as a plain string is instantiated, and a :class:`RunSummary` is added to the Trainer.

    Takes LightningCLI's arguments. ``ORTStrategy``'s options are typed, so
    ``strategy: {class_path: lightning_ort.ORTStrategy, init_args: {...}}`` is validated and shown in
    full by ``--print_config``.

    Args:
        summary: add a :class:`RunSummary` callback to the Trainer.
    """

    def __init__(self, *args: Any, summary: bool = True, **kwargs: Any) -> None:
        self.summary = summary
        super().__init__(*args, **kwargs)

    @override
    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_core_arguments_to_parser(parser)
        for action in parser._actions:
            if action.dest == "trainer.strategy" and type(action) is ActionTypeHint:
                action.__class__ = _StrategyArgument
                action.help = (action.help or "") + STRATEGY_HELP
            elif action.dest == "trainer.strategy.help" and type(action) is _ActionHelpClassPath:
                action.__class__ = _StrategyHelp

    @override
    def instantiate_trainer(self, **kwargs: Any) -> pl.Trainer:
        config = {**self._get(self.config_init, "trainer", default={})}
        strategy = config.get("strategy")
        if isinstance(strategy, str) and "strategy" not in kwargs:
            kwargs["strategy"] = _strategy_from_class_path(strategy)
        callbacks = config.get("callbacks") or []
        callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
        if self.summary and "callbacks" not in kwargs and not any(isinstance(c, RunSummary) for c in callbacks):
            kwargs["callbacks"] = [*callbacks, RunSummary()]
        return super().instantiate_trainer(**kwargs)


def main(args: ArgsType = None) -> ORTLightningCLI:
    """The ``lightning-ort`` command (without ``setup``): an :class:`ORTLightningCLI` over any
    LightningModule and LightningDataModule.

    Like ``python -m``, it puts the current directory first on ``sys.path``, so class paths can name
    modules of the project it is run from (``examples.gpt.model.GPT`` from the repository root).
    """
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    return ORTLightningCLI(
        model_class=None,
        datamodule_class=None,
        args=args,
        parser_kwargs={"prog": "lightning-ort", "description": DESCRIPTION},
    )
