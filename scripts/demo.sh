#!/usr/bin/env bash
# Set everything up, then jit a small model, print its final trace and its speed against eager.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
. .venv/bin/activate
python examples/demo.py "$@"
