#!/usr/bin/env bash
# Create (or reuse) .venv and install thunder-core with its test dependencies.
# Every install goes through constraints.txt, which pins the CPU build of torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
python -m pip install -q -c constraints.txt torch
python -m pip install -q -c constraints.txt -e ".[test,lint]"
