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
# The CPU build of torch comes from PyTorch's CPU index (PyPI's Linux wheel is the multi-GB CUDA
# build); pip prefers it (2.13.0+cpu) when both satisfy the pin. An index that cannot be reached
# is skipped, so a wheel found elsewhere (a local wheel directory in pip's config) still works.
TORCH_INDEX="${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
python -m pip install -q -c constraints.txt torch --extra-index-url "$TORCH_INDEX" --retries 1 --timeout 15
packages=(-e ".[test,lint]")
for package in executors/*/ plugins/*/; do
    if [ -f "$package/pyproject.toml" ]; then
        packages+=(-e "${package%/}[test]")
    fi
done
python -m pip install -q -c constraints.txt "${packages[@]}"
