#!/usr/bin/env bash
# Regenerates the Python CRI bindings (gitops/cri/pb/*) from protos/ with the
# grpcio-tools version pinned in pyproject.toml's `test` extra.
# Usage: scripts/gen-protos.sh [OUT_DIR]   (default: the repo root, i.e. in place)
# PYTHON selects the interpreter (default: .venv/bin/python, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-.}"
py="${PYTHON:-}"
if [ -z "$py" ]; then
    if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
mkdir -p "$out"
"$py" -m grpc_tools.protoc -I protos \
    --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
    gitops/cri/pb/runtime.proto
