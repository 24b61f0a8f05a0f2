#!/usr/bin/env bash
# Create or reuse .venv in the repository root and install lightning-ort with its CPU flavour of ORT.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null 2>&1 || python=python3
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
stamp=.venv/.lightning-ort-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -c constraints.txt -e ".[cpu,test]"
    touch "$stamp"
fi
# Build ORT's PyTorch extension ahead of time (reused from the cache afterwards).
.venv/bin/python -m lightning_ort setup
