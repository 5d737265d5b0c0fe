#!/usr/bin/env bash
# The main job on the embedded default: installs gitops, then runs it on the
# example repo. Extra arguments go to `gitops validate`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
.venv/bin/gitops validate example-repo "$@"
