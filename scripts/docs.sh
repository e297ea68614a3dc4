#!/usr/bin/env bash
# Build the docs site (docs/ + API reference from docstrings) into site/, warnings as errors,
# then check that every public name of thunder_core.extend is documented.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    bash scripts/setup-env.sh
fi
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1 NO_MKDOCS_2_WARNING=1
python -m pip install -q -c constraints.txt -e ".[docs]"
mkdocs build --strict --site-dir site
python scripts/check_api_reference.py site
