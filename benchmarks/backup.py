"""An etcd backup of a cluster with many objects: snapshot time and size, restic store time, dedup.

Starts a real etcd and kube-apiserver (`tests/kubeapi.py`, on 127.0.39.1; the cached binaries
of scripts/build-kubernetes.sh; no hypervisors, so no lab lock), creates `--configmaps` ConfigMaps
(default 10,000, `--bytes` of random hex data each, 8 writers) through the API, then backs etcd up with
`gitops.backup.take.back_up` into a local restic repository (Debian's restic) twice: the first
snapshot, then a second after 1% of the ConfigMaps changed (restic stores only what differs).

    python benchmarks/backup.py [--configmaps 10000] [--bytes 512] [--json]

Prints a line per step; with --json the last line is one JSON object: configmaps, create_s,
snapshot_bytes (the etcd database as streamed), first_backup_s (stream + read back + restic store +
retention), repository_bytes after it, second_backup_s, repository_growth_bytes, list_s.
"""
from __future__ import annotations

import argparse
import json
import secrets
import shutil
import ssl
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
for path in (REPO_ROOT, REPO_ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from kubeapi import kube_api_server  # noqa: E402

from gitops.backup.restic import Restic  # noqa: E402
from gitops.backup.take import back_up  # noqa: E402
from gitops.model.config import BackupTarget  # noqa: E402

IP = "127.0.39.1"


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def create(api, count: int, size: int, start: int = 0, label: str = "v1") -> None:
    def one(i: int) -> None:
        payload = secrets.token_hex(size // 2)  # random: etcd and restic get no free compression
        api.request("PUT" if start else "POST",
                    f"/api/v1/namespaces/default/configmaps{f'/cm-{i}' if start else ''}",
                    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i}"},
                     "data": {"payload": payload, "label": label}})

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, range(start, start + count)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configmaps", type=int, default=10_000)
    parser.add_argument("--bytes", type=int, default=512, help="data bytes per ConfigMap")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out: dict[str, object] = {"configmaps": args.configmaps}
    scratch = Path(tempfile.mkdtemp(prefix="gitops-bench-backup-"))
    try:
        with kube_api_server(IP) as api:
            print(f"creating {args.configmaps} ConfigMaps of {args.bytes} bytes ...", flush=True)
            started = time.monotonic()
            create(api, args.configmaps, args.bytes)
            out["create_s"] = round(time.monotonic() - started, 1)
            print(f"  {out['create_s']} s", flush=True)
            target = BackupTarget("bench", str(scratch / "repo"), "benchmark password")
            context = ssl.create_default_context()  # etcd here is plain HTTP on loopback: the context is unused
            started = time.monotonic()
            first = back_up(target, "bench", 10, context, {"m1": api.etcd_url})
            out["first_backup_s"] = round(time.monotonic() - started, 2)
            out["snapshot_bytes"] = first.bytes
            out["repository_bytes"] = du(scratch / "repo")
            print(f"first backup: {out['first_backup_s']} s, snapshot {first.bytes} bytes at revision "
                  f"{first.revision}, repository {out['repository_bytes']} bytes", flush=True)
            create(api, max(1, args.configmaps // 100), args.bytes, start=1, label="v2")
            started = time.monotonic()
            back_up(target, "bench", 10, context, {"m1": api.etcd_url})
            out["second_backup_s"] = round(time.monotonic() - started, 2)
            out["repository_growth_bytes"] = du(scratch / "repo") - int(out["repository_bytes"])
            print(f"second backup (1% changed): {out['second_backup_s']} s, repository grew "
                  f"{out['repository_growth_bytes']} bytes", flush=True)
            started = time.monotonic()
            listed = Restic(target).snapshots("bench")
            out["list_s"] = round(time.monotonic() - started, 2)
            print(f"list: {len(listed)} snapshots in {out['list_s']} s", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
