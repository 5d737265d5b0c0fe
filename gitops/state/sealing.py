"""A state's private keys apart from the rest (pure): what is sealed with age, and what may be read by anyone.

The status branch keeps the public half in the clear and the private one age-encrypted to the
controller's identity; a saved plan seals its planned state's keys the same way.
"""
from __future__ import annotations

import json
from typing import Any

from gitops.state.records import State


def split(state: State) -> tuple[dict[str, Any], dict[str, Any]]:
    """(public, secrets): every private key goes to `secrets`, nothing else does."""
    public = state.to_dict()
    secrets: dict[str, Any] = {"clusters": {}}
    for name, cluster in public["clusters"].items():
        keys: dict[str, Any] = {"authorities": {}}
        for role, record in cluster["authorities"].items():
            keys["authorities"][role] = record.pop("key_pem", "")
            record["key_pem"] = ""
        if cluster.get("admin"):
            keys["admin"] = cluster["admin"].get("key_pem", "")
            cluster["admin"]["key_pem"] = ""
        for role, record in ((cluster.get("rotation") or {}).get("other") or {}).items():
            keys.setdefault("rotation", {})[role] = record.pop("key_pem", "")
            record["key_pem"] = ""
        secrets["clusters"][name] = keys
    if public.get("hypervisor_ca"):
        secrets["hypervisor_ca"] = public["hypervisor_ca"].pop("key_pem", "")
        public["hypervisor_ca"]["key_pem"] = ""
    return public, secrets


def merge(public: dict[str, Any], secrets: dict[str, Any] | None) -> State:
    if secrets is None:  # the public part alone: its keys are blank already (`split`), nothing to copy in
        return State.from_dict(public)
    data = json.loads(json.dumps(public))
    for name, cluster in data.get("clusters", {}).items():
        keys = (secrets or {}).get("clusters", {}).get(name, {})
        for role, record in cluster.get("authorities", {}).items():
            record["key_pem"] = keys.get("authorities", {}).get(role, "")
        if cluster.get("admin"):
            cluster["admin"]["key_pem"] = keys.get("admin", "")
        for role, record in ((cluster.get("rotation") or {}).get("other") or {}).items():
            record["key_pem"] = keys.get("rotation", {}).get(role, "")
    if data.get("hypervisor_ca"):
        data["hypervisor_ca"]["key_pem"] = (secrets or {}).get("hypervisor_ca", "")
    return State.from_dict(data)


__all__ = ["merge", "split"]
