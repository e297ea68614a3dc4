#!/usr/bin/env bash
# Set everything up, then run the core's tests and every executor's and plugin's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
. .venv/bin/activate
targets=(tests)
for folder in executors/*/tests plugins/*/tests; do
    if [ -d "$folder" ]; then
        targets+=("$folder")
    fi
done
python -m pytest -q "${targets[@]}" "$@"
