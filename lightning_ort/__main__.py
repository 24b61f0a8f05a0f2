"""Command line: ``python -m lightning_ort setup`` builds ORT's PyTorch extension ahead of time."""

from __future__ import annotations

import argparse
import sys

from lightning_ort.errors import ORTSetupError


def _setup(verbose: bool) -> int:
    from lightning_ort._compat import check_installation, ortmodule_package
    from lightning_ort._compat.extensions import build_aten_op_executor, build_custom_function_runner

    check_installation()
    path, built = build_aten_op_executor(verbose=verbose)
    print(f"lightning_ort: aten_op_executor {'built' if built else 'reused'}: {path}")
    try:
        path, built = build_custom_function_runner(verbose=verbose)
        print(f"lightning_ort: custom autograd.Function runner {'built' if built else 'reused'}: {path}")
    except ORTSetupError as error:
        print(f"lightning_ort: custom autograd.Function support is unavailable: {error}", file=sys.stderr)
    ortmodule_package()
    print("lightning_ort: onnxruntime.training.ortmodule imports and is ready.")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m lightning_ort`` and the ``lightning-ort`` command."""
    parser = argparse.ArgumentParser(prog="lightning-ort", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    setup = commands.add_parser("setup", help="build ORT's PyTorch C++ extension into the cache and check the install")
    setup.add_argument("--verbose", action="store_true", help="show the compiler output")
    args = parser.parse_args(argv)
    try:
        return _setup(args.verbose)
    except ORTSetupError as error:
        print(f"lightning_ort: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
