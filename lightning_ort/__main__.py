"""The ``lightning-ort`` command (also ``python -m lightning_ort``).

``lightning-ort setup`` builds ORT's PyTorch extension ahead of time; ``lightning-ort fit|validate|test|predict``
is a LightningCLI with ``lightning_ort`` imported (see :mod:`lightning_ort.cli`).
"""

from __future__ import annotations

import argparse
import sys

from lightning_ort.errors import ORTSetupError


def _setup(verbose: bool) -> int:
    from lightning_ort.engine import check_installation, ortmodule_package
    from lightning_ort.engine.bootstrap.extensions import (
        ATEN_OP_EXECUTOR,
        build_aten_op_executor,
        build_custom_function_runner,
        build_missing,
        load_aten_ops,
    )

    check_installation()
    built_now = build_missing(verbose=verbose)
    path, built = build_aten_op_executor(verbose=verbose)
    built = built or ATEN_OP_EXECUTOR in built_now
    print(f"lightning_ort: aten_op_executor {'built' if built else 'reused'}: {path}")
    path = load_aten_ops(verbose=verbose)
    print(f"lightning_ort: lightning_ort's operators ready: {path}")
    try:
        path, built = build_custom_function_runner(verbose=verbose)
        print(f"lightning_ort: custom autograd.Function runner {'built' if built else 'reused'}: {path}")
    except ORTSetupError as error:
        print(f"lightning_ort: custom autograd.Function support is unavailable: {error}", file=sys.stderr)
    ortmodule_package()
    print("lightning_ort: onnxruntime.training.ortmodule imports and is ready.")
    return 0


def _setup_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="lightning-ort setup",
        description="Build ORT's PyTorch C++ extensions into the cache and check the install.",
    )
    parser.add_argument("--verbose", action="store_true", help="show the compiler output")
    args = parser.parse_args(argv)
    try:
        return _setup(args.verbose)
    except ORTSetupError as error:
        print(f"lightning_ort: {error}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m lightning_ort`` and the ``lightning-ort`` command."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["setup"]:
        return _setup_command(args[1:])
    from lightning_ort.cli import main as cli_main

    cli_main(None if argv is None else args)  # None: LightningCLI reads sys.argv itself
    return 0


if __name__ == "__main__":
    sys.exit(main())
