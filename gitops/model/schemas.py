"""The JSON Schemas (draft 2020-12) of every kind, shipped in `schemas/`."""
from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator

#: kind -> schema file name (in `schemas/`).
KINDS: dict[str, str] = {
    "Hypervisor": "hypervisor.schema.json",
    "Cluster": "cluster.schema.json",
    "Node": "node.schema.json",
    "SIPCluster": "sipcluster.schema.json",
    "BareMetalHost": "baremetalhost.schema.json",
    "Secret": "secret.schema.json",
    "GitopsConfig": "gitopsconfig.schema.json",
}

#: Kinds that may appear among the resources (GitopsConfig lives in gitops.yaml only).
RESOURCE_KINDS = tuple(k for k in KINDS if k != "GitopsConfig")


def schema_text(kind: str) -> str:
    return resources.files("gitops").joinpath("schemas", KINDS[kind]).read_text(encoding="utf-8")


@cache
def schema(kind: str) -> dict[str, Any]:
    return json.loads(schema_text(kind))


@cache
def validator(kind: str) -> Draft202012Validator:
    return Draft202012Validator(schema(kind))
