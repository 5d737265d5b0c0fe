"""Generated CRI runtime.v1 bindings (from protos/gitops/cri/pb/runtime.proto; do not edit).

Regenerate with `scripts/gen-protos.sh`; tests/test_protos.py checks they are current.
"""
