"""The management cluster's API from a kubeconfig file, through `gitops.kubeapi` (credentials in memfds).

Reads the current (or named) context: server, certificate-authority(-data),
client-certificate(-data) and client-key(-data), or token / tokenFile; file paths are
relative to the kubeconfig. Exec and auth-provider plugins are not supported here.
"""
from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from gitops.coordination.lease import CoordinationError
from gitops.kubeapi import Credentials, KubeAPI


def api_from_kubeconfig(path: str | Path, context: str | None = None, timeout: float = 10.0) -> KubeAPI:
    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text())
    except OSError as err:
        raise CoordinationError(f"{path}: cannot read kubeconfig: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise CoordinationError(f"{path}: not a kubeconfig: {' '.join(str(err).split())}") from None
    if not isinstance(config, dict):
        raise CoordinationError(f"{path}: not a kubeconfig")
    name = context or config.get("current-context")
    ctx = _named(config, "contexts", name, path).get("context") or {}
    cluster = _named(config, "clusters", ctx.get("cluster"), path).get("cluster") or {}
    user = _named(config, "users", ctx.get("user"), path).get("user") or {} if ctx.get("user") else {}
    if not cluster.get("server"):
        raise CoordinationError(f"{path}: cluster {ctx.get('cluster')!r} has no server")
    base = path.parent
    token = user.get("token") or (_file(base, user["tokenFile"], path).strip() if user.get("tokenFile") else "")
    credentials = Credentials(cert_pem=_pem(user, "client-certificate", base, path),
                              key_pem=_pem(user, "client-key", base, path), token=token)
    if bool(credentials.cert_pem) != bool(credentials.key_pem):
        raise CoordinationError(f"{path}: user {ctx.get('user')!r} needs both client-certificate and client-key")
    return KubeAPI(cluster["server"], _pem(cluster, "certificate-authority", base, path), credentials,
                   timeout=timeout)


def _named(config: dict[str, Any], section: str, name: str | None, path: Path) -> dict[str, Any]:
    for item in config.get(section) or []:
        if isinstance(item, dict) and item.get("name") == name:
            return item
    raise CoordinationError(f"{path}: no {section[:-1]} named {name!r}")


def _pem(section: dict[str, Any], key: str, base: Path, path: Path) -> str:
    if section.get(f"{key}-data"):
        try:
            return base64.b64decode(section[f"{key}-data"]).decode()
        except ValueError:
            raise CoordinationError(f"{path}: {key}-data is not base64 PEM") from None
    return _file(base, section[key], path) if section.get(key) else ""


def _file(base: Path, name: str, path: Path) -> str:
    try:
        return (base / name).read_text()
    except OSError as err:
        raise CoordinationError(f"{path}: cannot read {name}: {err.strerror}") from None
