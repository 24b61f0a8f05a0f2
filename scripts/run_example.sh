#!/usr/bin/env bash
# Set up (or reuse) .venv, then train the GPT-style example through ORT:
# `bash scripts/run_example.sh [train.py args]` (add `--strategy auto` for plain PyTorch).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_venv.sh"
cd "$root"
exec .venv/bin/python examples/gpt/train.py --strategy ort "$@"
