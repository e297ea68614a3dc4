#!/usr/bin/env bash
# Create (or reuse) .venv; install thunder-core and every package under executors/ and plugins/,
# with their test dependencies. Every install goes through constraints.txt (CPU torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
python -m pip install -q -c constraints.txt torch
packages=(-e ".[test,lint]")
for package in executors/*/ plugins/*/; do
    if [ -f "$package/pyproject.toml" ]; then
        packages+=(-e "${package%/}[test]")
    fi
done
python -m pip install -q -c constraints.txt "${packages[@]}"
