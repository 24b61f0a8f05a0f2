#!/usr/bin/env bash
# Run the test suite against the torch release you name:
#   bash scripts/test_torch.sh 2.15.0 [pytest args]
# Creates or reuses .venv-torch-VERSION/ (PYTHON=python3.12 picks the interpreter; the folder then
# is .venv-torch-VERSION-py3.12/) with that torch, the torchvision pip pairs with it, timm, and
# lightning-ort[cpu,test] at this project's pins (constraints.txt, its torch pin left out).
# torch and its dependencies (several GB for PyPI's CUDA builds) are downloaded once into a wheel
# cache, $LIGHTNING_ORT_WHEELS (default ~/.cache/lightning_ort/wheels), and installed from there.
# Set TORCHVISION=0.29.1 to choose the torchvision release.
set -euo pipefail
if [ $# -lt 1 ] || [[ "$1" == -* ]]; then
    echo "usage: bash scripts/test_torch.sh TORCH_VERSION [pytest args]   (e.g. 2.15.0)" >&2
    exit 2
fi
version="$1"
shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3.11}"
if ! command -v "$python" >/dev/null 2>&1; then
    echo "scripts/test_torch.sh: $python not found. Fix: install it or set PYTHON to an interpreter (3.10 - 3.12)." >&2
    exit 2
fi
py_tag="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
venv=".venv-torch-$version"
[ -n "${PYTHON:-}" ] && venv="$venv-py$py_tag"
wheels="${LIGHTNING_ORT_WHEELS:-$HOME/.cache/lightning_ort/wheels}"
torchvision="torchvision${TORCHVISION:+==$TORCHVISION}"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
# The project's pins without its torch pin, and the torch named here. Passed as PIP_CONSTRAINT, they
# replace any constraint file pip's configuration names (which may cap torch below the one asked for).
constraints="$venv/constraints.txt"
{ grep -v '^torch==' constraints.txt; echo "torch==$version"; } >"$constraints.new"
stamp="$venv/.lightning-ort-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || ! cmp -s "$constraints.new" "$constraints"; then
    mv "$constraints.new" "$constraints"
    export PIP_CONSTRAINT="$root/$constraints"
    pip=("$venv/bin/python" -m pip)
    "${pip[@]}" install --quiet --upgrade pip
    downloaded="$wheels/.torch-$version-py$py_tag-${TORCHVISION:-any}.complete"
    if [ ! -f "$downloaded" ]; then
        mkdir -p "$wheels"
        echo "scripts/test_torch.sh: downloading torch $version and its dependencies into $wheels (once)..." >&2
        "${pip[@]}" download --quiet --find-links "$wheels" -d "$wheels" "torch==$version" "$torchvision" timm
        touch "$downloaded"
    fi
    "${pip[@]}" install --quiet --no-index --find-links "$wheels" "torch==$version" "$torchvision" timm
    # lightning-ort's dependencies (torch is installed above) from pyproject, then the package itself,
    # so that a torch outside pyproject's range can be tried as well.
    mapfile -t requirements < <("$venv/bin/python" - <<'EOF'
import re
import tomllib

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
for requirement in project["dependencies"] + extras["cpu"] + extras["test"]:
    if re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0] != "torch":
        print(requirement)
EOF
    )
    "${pip[@]}" install --quiet --find-links "$wheels" "${requirements[@]}"
    "${pip[@]}" install --quiet --no-deps -e .
    touch "$stamp"
else
    rm -f "$constraints.new"
fi
installed="$("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
case "$installed" in
"$version" | "$version"+*) ;;
*)
    echo "scripts/test_torch.sh: $venv has torch $installed, not $version. Fix: rm -r $venv and rerun." >&2
    exit 1
    ;;
esac
# Build the C++ extensions against this torch ahead of the tests (cached per torch build).
"$venv/bin/python" -m lightning_ort setup
exec "$venv/bin/python" -m pytest "$@"
