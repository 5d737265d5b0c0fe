"""Prometheus metrics and health for `gitops watch`: /metrics and /healthz on one small HTTP server."""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


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


def serve(metrics: Metrics, address: str, stale_after: float) -> ThreadingHTTPServer:
    """Serve /metrics and /healthz on `host:port` in a daemon thread.

    /healthz is 200 while the reconcile loop has turned within `stale_after` seconds.
    """
    host, _, port = address.rpartition(":")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/metrics":
                body, code, kind = generate_latest(metrics.registry), 200, CONTENT_TYPE_LATEST
            elif self.path == "/healthz":
                age = time.time() - metrics.last_loop
                code = 200 if age <= stale_after else 503
                body = json.dumps({"ok": code == 200, "secondsSinceLoop": round(age, 1),
                                   "lastResult": metrics.last_result}).encode()
                kind = "application/json"
            else:
                body, code, kind = b"not found\n", 404, "text/plain"
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host or "127.0.0.1", int(port)), Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
