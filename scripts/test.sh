#!/usr/bin/env bash
# Set up (or reuse) .venv, then run the test suite: `bash scripts/test.sh [pytest args]`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_venv.sh"
cd "$root"
exec .venv/bin/python -m pytest "$@"
