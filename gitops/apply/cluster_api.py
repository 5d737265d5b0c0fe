"""Apply's handlers inside a cluster's own API, as its admin: objects, and certificate requests signed."""
from __future__ import annotations

import base64
import dataclasses
import json
import time

from gitops.apply.run import ApplyError, Run
from gitops.pki import load_csr_pem, sign_public_key
from gitops.pki.x509 import cert_to_pem
from gitops.plan.actions import Action
from gitops.plan.payloads import PutObject, SignRequest


def create_object(run: Run, action: Action, p: PutObject) -> None:
    with run.api(p.cluster, p.server) as api:
        if p.wait_ready:
            deadline = time.monotonic() + p.wait_ready
            run.until_ready(action, api, "/readyz", deadline, f"the API of cluster {p.cluster}",
                              lambda _: f"the API of cluster {p.cluster} at {p.server} not ready after "
                                        f"{p.wait_ready}s")
        api.apply(p.collection, json.loads(p.body))


def sign_certificate_request(run: Run, action: Action, p: SignRequest) -> None:
    """Approve (when the plan says so) and sign exactly the request the plan saw."""
    path = f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{p.name}"
    with run.api(p.cluster, p.server) as api:
        current = api.get(path)
        if current is None or current["metadata"].get("uid") != p.uid:
            raise ApplyError(f"certificate request {p.name} is gone or was replaced since the plan")
        if p.approve:
            conditions = list((current.get("status") or {}).get("conditions") or [])
            if not any(c.get("type") == p.approval.type for c in conditions):
                conditions.append(dataclasses.asdict(p.approval))
                current = api.request("PUT", f"{path}/approval", {**current, "status": {
                    **(current.get("status") or {}), "conditions": conditions}})
        request = load_csr_pem(p.request)
        cert = sign_public_key(run.signer(p.cluster, "cluster"),
                               request.public_key(), p.common_name, organizations=p.organizations,
                               dns_names=p.dns_names, ip_addresses=p.ip_addresses, server=p.server_auth,
                               client=p.client_auth, days=p.days, now=run.now)
        status = {**(current.get("status") or {}),
                  "certificate": base64.b64encode(cert_to_pem(cert).encode()).decode()}
        api.request("PUT", f"{path}/status", {**current, "status": status})
