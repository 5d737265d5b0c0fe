#!/usr/bin/env bash
# The test command: installs what the tests need, then runs the whole suite.
# Extra arguments go to pytest (e.g. `scripts/test.sh -k validate -x`).
# pytest's exit code is kept: 5 (no test collected) fails like any real failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
# pyproject leaves the `image` tests (buildah, minutes) out of plain `pytest`; this command, which
# CI runs, selects them too (a `-m` given here still wins: the last one counts). Two workers
# (pytest-xdist) in two lanes: one runs the heaviest lab groups one after another; the other runs the
# Python-only tests, then the other lab groups, the image build first (tests/conftest.py LAB_GROUPS,
# SECOND_LANE).
exec .venv/bin/python -m pytest -n 2 --dist loadgroup --no-loadscope-reorder -m "image or not image" --durations=25 "$@"
