"""Prometheus metrics and health for `gitops watch`: /metrics and /healthz, served as a WSGI app (beside the UI
with `--ui`)."""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gitops.httpserve import Server, WSGIApp, start


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter("gitops_reconcile_total", "Reconciles by result.", ["result"],
                                  registry=self.registry)
        self.duration = Histogram("gitops_reconcile_duration_seconds", "Time one reconcile took.",
                                  registry=self.registry, buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600))
        self.last_success = Gauge("gitops_last_success_timestamp_seconds",
                                  "Unix time of the last reconcile that applied its commit.", registry=self.registry)
        self.errors = Counter("gitops_reconcile_errors_total", "Reconciles that failed or raised.",
                              registry=self.registry)
        self.backup_age = Gauge("gitops_etcd_backup_age_seconds",
                                "Seconds since the cluster's last etcd snapshot (spec.backup).", ["cluster"],
                                registry=self.registry)
        self.backup_ok = Gauge("gitops_etcd_backup_ok", "1 when the cluster's last etcd snapshot attempt worked.",
                               ["cluster"], registry=self.registry)
        self.untrusted_status = Counter("gitops_status_untrusted_commits_total",
                                        "Status-branch tips set aside: unsigned, signed by a key not pinned, or not "
                                        "descending from the last status commit verified.", registry=self.registry)
        self.last_loop = time.time()
        self.last_result = ""

    def record(self, seconds: float, result: str) -> None:
        self.reconciles.labels(result=result).inc()
        self.duration.observe(seconds)
        self.last_result = result
        if result == "applied":
            self.last_success.set(time.time())
        elif result in ("failed", "error"):
            self.errors.inc()

    def backups(self, statuses: Mapping[str, Any]) -> None:
        """Each cluster's last snapshot (`gitops.status.backups.BackupStatus`): its age, computed when scraped."""
        for cluster, status in statuses.items():
            when = status.last_time
            if when is not None:
                stamp = when.timestamp()
                self.backup_age.labels(cluster=cluster).set_function(lambda stamp=stamp: time.time() - stamp)
            self.backup_ok.labels(cluster=cluster).set(0 if status.failed_at and (
                when is None or status.failed_at > when) else 1)

    def heartbeat(self) -> None:
        self.last_loop = time.time()


def wsgi(metrics: Metrics, stale_after: float, fallback: WSGIApp | None = None) -> WSGIApp:
    """/metrics and /healthz; any other path goes to `fallback` (the UI of `gitops watch --ui`), else 404.

    /healthz is 200 while the reconcile loop has turned within `stale_after` seconds.
    """
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            body, code, kind = generate_latest(metrics.registry), "200 OK", CONTENT_TYPE_LATEST
        elif path == "/healthz":
            age = time.time() - metrics.last_loop
            fresh = age <= stale_after
            code = "200 OK" if fresh else "503 Service Unavailable"
            body = json.dumps({"ok": fresh, "secondsSinceLoop": round(age, 1),
                               "lastResult": metrics.last_result}).encode()
            kind = "application/json"
        elif fallback is not None:
            return fallback(environ, start_response)
        else:
            body, code, kind = b"not found\n", "404 Not Found", "text/plain"
        start_response(code, [("Content-Type", kind), ("Content-Length", str(len(body)))])
        return [body]

    return app


def serve(metrics: Metrics, address: str, stale_after: float, fallback: WSGIApp | None = None) -> Server:
    """Serve /metrics and /healthz (and `fallback` on every other path) on `host:port` in a daemon thread."""
    return start(wsgi(metrics, stale_after, fallback), address, "metrics")
