"""A bounded API probe: an API read through a cluster's ingress every 100 ms, as the admin.

Each request opens a fresh TLS connection (so the ingress chooses a backend every time) with the
credentials of an admin kubeconfig and reads `GET /api/v1/namespaces/default` (authentication,
authorization and a quorum read from etcd: what a client does), and counts as failed unless it
answers 200 (`/readyz` as `path`: unless `200 ok`; a draining API server answers it 500 on
purpose while it still serves every other request, so it measures readiness, not service). A failed
request is retried once at once on a new connection; when that fails too the API was away (an
*outage*). `use_kubeconfig` switches credentials mid-run (a CA rotation publishes a new admin
kubeconfig). `Writer` writes a ConfigMap every 200 ms and remembers the acknowledged ones, which must
all be there after a fault. Used by the lab tests and the benchmarks (`api_probe.py`, `faults.py`).
"""
from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from gitops.kubeapi import MemoryFiles
from gitops.kubeconfig import admin_credentials

#: errors kept for the report (the counts are exact; the list is bounded)
MAX_ERRORS = 50


@dataclass(frozen=True)
class Target:
    """Where and as whom the probe asks: the kubeconfig's server and a TLS context holding its
    CA and client certificate."""

    host: str
    port: int
    context: ssl.SSLContext


def admin_tls(text: str, with_credentials: bool = True) -> tuple[str, int, ssl.SSLContext]:
    """(host, port, TLS context) to reach the API server of a kubeconfig with embedded credentials (what
    `admin_kubeconfig` writes): the context verifies the server with the kubeconfig's CA and, `with_credentials`,
    presents its client certificate (read through anonymous memory files: the key never touches the disk).
    ValueError for any other kubeconfig."""
    server, ca, cert, key = admin_credentials(text)
    context = ssl.create_default_context(cadata=ca)
    if with_credentials:
        with MemoryFiles() as files:
            context.load_cert_chain(files.add("admin-crt", cert), files.add("admin-key", key))
    url = urlsplit(server)
    if url.scheme != "https" or not url.hostname or not url.port:
        raise ValueError(f"kubeconfig server {server!r} is not https://host:port")
    return url.hostname, url.port, context


def target(kubeconfig: str) -> Target:
    """The `Target` of an admin kubeconfig's text (embedded CA, client certificate and key)."""
    return Target(*admin_tls(kubeconfig))


@dataclass(frozen=True)
class Counts:
    """What a probe saw: requests sent, failed ones, outages (failed and failed again at once)."""

    requests: int
    failures: int
    outages: int
    seconds: float
    errors: tuple[str, ...]
    #: the longest time the API was away: from the sending of a failed request to the end of the next answer
    #: (its immediate retry's, or a later request's)
    longest_outage: float = 0.0


class Probe(threading.Thread):
    """`GET path` every `interval` seconds until `stop()`; `with Probe(...) as probe:` starts and stops it."""

    def __init__(self, kubeconfig: str, interval: float = 0.1, path: str = "/api/v1/namespaces/default",
                 timeout: float = 5.0):
        super().__init__(daemon=True, name="api-probe")
        self.interval, self.path, self.timeout = interval, path, timeout
        self._target = target(kubeconfig)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.requests = self.failures = self.outages = 0
        self.errors: list[str] = []
        self._began = self._ended = 0.0
        self._down_since: float | None = None
        self.longest_outage = 0.0

    def use_kubeconfig(self, kubeconfig: str) -> None:
        """Ask with another admin kubeconfig from the next request on (parsed before the switch)."""
        new = target(kubeconfig)
        with self._lock:
            self._target = new

    def _get(self) -> str | None:
        """None when the API answered `200 ok`, else what went wrong."""
        with self._lock:
            where = self._target
        conn = http.client.HTTPSConnection(where.host, where.port, context=where.context, timeout=self.timeout)
        try:
            conn.request("GET", self.path)
            response = conn.getresponse()
            body = response.read()
            if response.status == 200 and (self.path != "/readyz" or body == b"ok"):
                return None
            text = body.decode(errors="replace")
            failed = [line for line in text.splitlines() if line.startswith("[-]")]  # /readyz's failed checks
            if not failed:
                try:
                    failed = [str(json.loads(text)["message"])]  # a Status object
                except (ValueError, KeyError, TypeError):
                    failed = [repr(body[:200])]
            return f"{response.status} " + ", ".join(failed)
        except (OSError, http.client.HTTPException) as err:
            return f"{type(err).__name__}: {err}"
        finally:
            conn.close()

    def run(self) -> None:
        self._began = time.monotonic()
        while not self._stopping.wait(self.interval):
            asked = time.monotonic()
            error = self._get()
            retry = self._get() if error is not None else None
            with self._lock:
                self.requests += 1
                if error is not None and self._down_since is None:
                    self._down_since = asked  # away since this request was sent, at the latest
                if (error is None or retry is None) and self._down_since is not None:
                    self.longest_outage = max(self.longest_outage, time.monotonic() - self._down_since)
                    self._down_since = None
                if error is None:
                    continue
                self.failures += 1
                self.outages += retry is not None
                if len(self.errors) < MAX_ERRORS:
                    stamp = time.strftime("%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"
                    self.errors.append(f"{stamp} {error}; retry: {retry or 'ok'}")
        self._ended = time.monotonic()

    def counts(self) -> Counts:
        with self._lock:
            end = self._ended or time.monotonic()
            longest = self.longest_outage
            if self._down_since is not None:  # still away
                longest = max(longest, end - self._down_since)
            return Counts(self.requests, self.failures, self.outages, round(end - (self._began or end), 3),
                          tuple(self.errors), round(longest, 3))

    def stop(self) -> Counts:
        self._stopping.set()
        if self.is_alive():
            self.join(timeout=self.timeout * 2 + 5)
        return self.counts()

    def __enter__(self) -> "Probe":
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class Writes:
    """What a writer saw: ConfigMaps acknowledged (201) by name, and writes that failed."""

    acknowledged: tuple[str, ...]
    failures: int
    errors: tuple[str, ...]


class Writer(threading.Thread):
    """`POST` a new ConfigMap to `namespace` every `interval` seconds until `stop()`, through the kubeconfig's
    server, each on a fresh connection; remembers every name the API acknowledged (201 Created): after a
    fault, each of them must still be there (`missing`)."""

    def __init__(self, kubeconfig: str, prefix: str, namespace: str = "default", interval: float = 0.2,
                 timeout: float = 5.0):
        super().__init__(daemon=True, name="api-writer")
        self.prefix, self.namespace, self.interval, self.timeout = prefix, namespace, interval, timeout
        self._target = target(kubeconfig)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.acknowledged: list[str] = []
        self.failures = 0
        self.errors: list[str] = []

    def _post(self, name: str) -> str | None:
        where = self._target
        body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                           "data": {"written": name}})
        conn = http.client.HTTPSConnection(where.host, where.port, context=where.context, timeout=self.timeout)
        try:
            conn.request("POST", f"/api/v1/namespaces/{self.namespace}/configmaps", body,
                         {"Content-Type": "application/json"})
            response = conn.getresponse()
            text = response.read()
            return None if response.status == 201 else f"{response.status} {text[:200]!r}"
        except (OSError, http.client.HTTPException) as err:
            return f"{type(err).__name__}: {err}"
        finally:
            conn.close()

    def run(self) -> None:
        n = 0
        while not self._stopping.wait(self.interval):
            n += 1
            name = f"{self.prefix}-{n:05d}"
            error = self._post(name)
            with self._lock:
                if error is None:
                    self.acknowledged.append(name)
                else:
                    self.failures += 1
                    if len(self.errors) < MAX_ERRORS:
                        self.errors.append(f"{time.strftime('%H:%M:%S')} {name}: {error}")

    def stop(self) -> Writes:
        self._stopping.set()
        if self.is_alive():
            self.join(timeout=self.timeout * 2 + 5)
        with self._lock:
            return Writes(tuple(self.acknowledged), self.failures, tuple(self.errors))

    def missing(self, writes: Writes) -> list[str]:
        """The acknowledged ConfigMaps the API does not have now (a lost write), read with one list."""
        where = self._target
        conn = http.client.HTTPSConnection(where.host, where.port, context=where.context, timeout=30)
        try:
            conn.request("GET", f"/api/v1/namespaces/{self.namespace}/configmaps")
            response = conn.getresponse()
            listed = json.loads(response.read())
        finally:
            conn.close()
        if response.status != 200:
            raise RuntimeError(f"listing ConfigMaps answered {response.status}")
        there = {item["metadata"]["name"] for item in listed.get("items", ())}
        return [name for name in writes.acknowledged if name not in there]
