"""The workloads a lab worker runs in the demo and the worker tests: Kubernetes manifests kept as
files in `manifests/` (scripts/demo.sh applies the same files), with an `IMAGE` placeholder."""
from __future__ import annotations

from pathlib import Path

MANIFESTS = Path(__file__).parent / "manifests"


def manifest(name: str, image: str) -> str:
    """`manifests/<name>.yaml` with its IMAGE placeholder set to `image`."""
    return (MANIFESTS / f"{name}.yaml").read_text(encoding="utf-8").replace("IMAGE", image)
