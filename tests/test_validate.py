"""`gitops validate`: schemas, semantic rules and the exact file:line of every error."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from jsonschema import Draft202012Validator
from repo_helpers import (
    EXAMPLE_REPO,
    allow_plaintext,
    make_cert,
    minimal_repo,
    pem_cert,
    pem_key,
    remote_hypervisor_yaml,
    write,
)
from test_yamlload import billion_laughs

from gitops.cli import cli
from gitops.model import schemas
from gitops.model.components import CONTROLPLANE
from gitops.model.resources import LocalCRIEndpoint, RemoteCRIEndpoint
from gitops.model.validate import validate_repo


def line_of(path: Path, needle: str) -> int:
    """1-based line of the first line of `path` containing `needle`."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def errors(root: Path) -> list[str]:
    return [str(d) for d in validate_repo(root).diagnostics]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return minimal_repo(tmp_path / "repo")


# --- the example repo and the CLI -------------------------------------------------

def test_example_repo_validates_through_the_installed_command():
    gitops = shutil.which("gitops", path=str(Path(sys.executable).parent))
    assert gitops, "the gitops console script is not installed next to this python"
    proc = subprocess.run([gitops, "validate", str(EXAMPLE_REPO)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "4 Hypervisor" in proc.stdout and "10 Node" in proc.stdout and "10 BareMetalHost" in proc.stdout


def test_example_repo_model_has_what_the_issue_asks_for():
    model = validate_repo(EXAMPLE_REPO).model
    assert model is not None
    hvs = model.hypervisors.values()
    assert sum(h.public for h in hvs) == 2 and sum(not h.public for h in hvs) == 2
    assert any(isinstance(h.endpoint, RemoteCRIEndpoint) and not h.public for h in hvs)
    assert len(model.clusters) == 2
    for name in model.clusters:
        roles = sorted(n.role for n in model.nodes_of(name))
        assert roles == [CONTROLPLANE] * 3 + ["controlplane-ingress"] * 2  # two: a virtual IP (issue #44.6)
    assert model.ingress.virtual_ips
    assert len(model.sip_clusters) == 1
    racks = {h.labels["sip.airshipit.org/rack"] for h in model.baremetal_hosts.values()}
    assert len(model.baremetal_hosts) >= 8 and len(racks) == 2


def test_minimal_repo_builds_typed_model(repo):
    model = validate_repo(repo).model
    assert model is not None
    assert model.hypervisors["hv-1"].endpoint == LocalCRIEndpoint("/run/hv-1.sock")
    assert model.hypervisors["edge-1"].public is True
    assert model.clusters["c1"].kubernetes_version == "v1.36.3"
    assert model.clusters["c1"].image("kube-apiserver") == "registry.k8s.io/kube-apiserver:v1.36.3"
    assert model.nodes["c1-ingress"].hypervisor == "edge-1"


def test_cli_exit_codes_and_json_output(repo):
    runner = CliRunner()
    ok = runner.invoke(cli, ["validate", str(repo), "-o", "json"])
    assert ok.exit_code == 0
    assert json.loads(ok.output)["valid"] is True
    write(repo, "bad.yaml", """
        apiVersion: gitops.infra/v1alpha1
        kind: Node
        metadata:
          name: c1-cp-2
        spec:
          cluster: c1
          role: worker
        """)
    bad = runner.invoke(cli, ["validate", str(repo), "-o", "json"])
    assert bad.exit_code == 1
    payload = json.loads(bad.output)
    assert payload["valid"] is False
    assert payload["errors"] == [{
        "file": "bad.yaml", "line": 7, "subject": "Node/c1-cp-2", "field": "spec.role",
        "message": "must be one of controlplane, controlplane-ingress; got 'worker'",
    }]
    text = runner.invoke(cli, ["validate", str(repo)])
    assert text.exit_code == 1
    assert "bad.yaml:7: Node/c1-cp-2: spec.role: must be one of" in text.output
    assert "Traceback" not in text.output


def test_missing_repo_directory_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(cli, ["validate", str(tmp_path / "nope")])
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert "nope" in result.output


def test_empty_repo_is_valid_with_no_resources(tmp_path):
    result = CliRunner().invoke(cli, ["validate", str(tmp_path)])
    assert result.exit_code == 0
    assert "0 documents in 0 files (no resources)" in result.output


# --- schemas, one kind at a time ----------------------------------------------------

@pytest.mark.parametrize("kind", sorted(schemas.KINDS))
def test_each_schema_is_a_valid_draft_2020_12_schema(kind):
    Draft202012Validator.check_schema(schemas.schema(kind))
    assert schemas.schema(kind)["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_schema_command_writes_the_files(tmp_path):
    result = CliRunner().invoke(cli, ["schema", "--write", str(tmp_path)])
    assert result.exit_code == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted(schemas.KINDS.values())
    shown = CliRunner().invoke(cli, ["schema", "node"])
    assert json.loads(shown.output)["title"] == "Node"


def test_hypervisor_schema_errors(repo):
    write(repo, "hv.yaml", """
        apiVersion: gitops.infra/v1alpha1
        kind: Hypervisor
        metadata:
          name: hv-2
        spec:
          ipAddress: 127.0.30.5
          portRange:
            low: "30000"
            high: 30100
          localCRIEndpoint:
            criEndpointPath: /run/x.sock
          remoteCRIEndpoint:
            criEndpointURI: tcp://127.0.30.5:7443
          color: blue
        """)
    assert errors(repo) == [
        "hv.yaml:5: Hypervisor/hv-2: spec: exactly one of localCRIEndpoint or remoteCRIEndpoint is required",
        "hv.yaml:8: Hypervisor/hv-2: spec.portRange.low: '30000' is not of type 'integer'",
        "hv.yaml:12: Hypervisor/hv-2: spec.remoteCRIEndpoint: missing required field 'caCertificate'",
        "hv.yaml:12: Hypervisor/hv-2: spec.remoteCRIEndpoint: missing required field 'clientCertificate'",
        "hv.yaml:14: Hypervisor/hv-2: spec.color: unknown field (allowed: cordoned, drain, interface, ipAddress, localCRIEndpoint, lost, "
        "portRange, public, remoteCRIEndpoint)",
    ]


def test_cluster_schema_errors(repo):
    write(repo, "c2.yaml", """
        apiVersion: gitops.infra/v1alpha1
        kind: Cluster
        metadata:
          name: C2
        spec:
          kubernetesVersion: latest
        """)
    assert errors(repo) == [
        "c2.yaml:4: Cluster/C2: metadata.name: 'C2' is invalid: DNS-1123 label: lower-case letters, digits and '-'.",
        "c2.yaml:6: Cluster/C2: spec.kubernetesVersion: 'latest' is invalid: "
        "Kubernetes version, e.g. 1.37.2 (a leading v is accepted); gitops supports 1.35 to 1.37.",
    ]


@pytest.mark.parametrize("version", ["1.20.2", "1.34.4", "1.38.0", "2.0.0", "v1.10.1"])
def test_unsupported_kubernetes_versions_name_file_line_field_and_range(repo, version):
    path = write(repo, "old.yaml", f"""
        apiVersion: gitops.infra/v1alpha1
        kind: Cluster
        metadata:
          name: old
        spec:
          kubernetesVersion: "{version}"
        """)
    line = line_of(path, "kubernetesVersion")
    assert errors(repo) == [
        f"old.yaml:{line}: Cluster/old: spec.kubernetesVersion: Kubernetes {version.removeprefix('v')} is not "
        "supported: gitops supports 1.35.0 to 1.37.x"]


@pytest.mark.parametrize("version", ["1.35.0", "v1.35.4", "1.36.3", "v1.37.2", "1.37.9"])
def test_supported_kubernetes_versions_validate(repo, version):
    write(repo, "ok.yaml", f"""
        apiVersion: gitops.infra/v1alpha1
        kind: Cluster
        metadata:
          name: ok
        spec:
          kubernetesVersion: "{version}"
        """)
    assert errors(repo) == []


def test_node_and_kind_errors(repo):
    write(repo, "n.yaml", """
        apiVersion: gitops.infra/v1
        kind: Node
        metadata:
          name: c1-cp-9
        spec:
          role: controlplane
        ---
        apiVersion: gitops.infra/v1alpha1
        kind: Nodes
        metadata:
          name: x
        """)
    assert errors(repo) == [
        "n.yaml:1: Node/c1-cp-9: apiVersion: must be 'gitops.infra/v1alpha1', got 'gitops.infra/v1'",
        "n.yaml:5: Node/c1-cp-9: spec: missing required field 'cluster'",
        "n.yaml:9: Nodes/x: kind: unknown kind 'Nodes' (one of: Hypervisor, Cluster, Node, SIPCluster, BareMetalHost, "
        "Secret)",
    ]


def test_sipcluster_schema_and_selector_errors(repo):
    write(repo, "sip.yaml", """
        apiVersion: gitops.infra/v1alpha1
        kind: SIPCluster
        metadata:
          name: t1
        spec:
          nodes:
            ControlPlane:
              count: {active: -1}
              spreadTopology: PerZone
            Worker:
              count: {active: 2}
              labelSelector:
                matchExpressions:
                  - key: flavor
                    operator: In
                  - key: gpu
                    operator: Exists
                    values: [a100]
        """)
    assert errors(repo) == [
        "sip.yaml:8: SIPCluster/t1: spec.nodes.ControlPlane.count.active: -1 is less than the minimum of 0",
        "sip.yaml:9: SIPCluster/t1: spec.nodes.ControlPlane.spreadTopology: must be one of PerRack, PerHost; "
        "got 'PerZone'",
    ]
    # The selector rules are semantic: they show once the schema errors are gone.
    text = (repo / "sip.yaml").read_text().replace("active: -1", "active: 1").replace("PerZone", "PerRack")
    (repo / "sip.yaml").write_text(text)
    assert errors(repo) == [
        "sip.yaml:14: SIPCluster/t1: spec.nodes.Worker.labelSelector.matchExpressions[0]: "
        "operator In needs a non-empty 'values'",
        "sip.yaml:18: SIPCluster/t1: spec.nodes.Worker.labelSelector.matchExpressions[1].values: "
        "operator Exists takes no 'values'",
    ]


def test_baremetalhost_export_loads_with_extra_fields_and_reports_item_lines(repo):
    write(repo, "bmh.yaml", """
        apiVersion: v1
        kind: List
        items:
        - apiVersion: metal3.io/v1alpha1
          kind: BareMetalHost
          metadata:
            name: h1
            namespace: metal3
            uid: 0b8e4a8c-1d5e-4d6b-9d3f-8d1f3f5b2a11
            resourceVersion: "4242"
          spec:
            online: true
            bootMACAddress: 52:54:00:aa:bb:01
            hardwareProfile: unknown
          status:
            operationalStatus: OK
            hardware: {cpu: {count: 8}}
        - apiVersion: metal3.io/v1alpha1
          kind: BareMetalHost
          metadata:
            name: h2
          spec:
            online: "yes please"
        """)
    assert errors(repo) == ["bmh.yaml:23: BareMetalHost/h2: spec.online: 'yes please' is not of type 'boolean'"]
    (repo / "bmh.yaml").write_text((repo / "bmh.yaml").read_text().replace('"yes please"', "false"))
    model = validate_repo(repo).model
    assert model is not None
    assert model.baremetal_hosts["metal3/h1"].online is True
    assert model.baremetal_hosts["default/h2"].online is False


def test_repo_config_errors_and_paths(repo):
    write(repo, "gitops.yaml", """
        apiVersion: gitops.infra/v1alpha1
        kind: GitopsConfig
        spec:
          paths: [clusters, missing]
          statusBranch: ops/status
        """)
    # Only clusters/ is read now, so the node pinned to edge-1 points nowhere.
    assert errors(repo) == [
        "clusters/c1.yaml:25: Node/c1-ingress: spec.hypervisor: Hypervisor 'edge-1' does not exist (none defined)",
        "gitops.yaml:4: GitopsConfig: spec.paths[1]: 'missing' does not exist or is not a directory",
    ]
    assert validate_repo(repo).repo.config.status_branch == "ops/status"
    write(repo, "gitops.yaml", """
        apiVersion: gitops.infra/v1alpha1
        kind: GitopsConfig
        spec:
          prune: {maxDeletes: many}
        """)
    assert errors(repo) == ["gitops.yaml:4: GitopsConfig: spec.prune.maxDeletes: 'many' is not of type 'integer'"]


# --- semantic rules ------------------------------------------------------------------

def test_duplicate_names_point_at_both_documents(repo):
    write(repo, "more/dup.yaml", """
        # a second definition of c1
        apiVersion: gitops.infra/v1alpha1
        kind: Cluster
        metadata:
          name: c1
        spec:
          kubernetesVersion: "1.36.0"
        """)
    assert errors(repo) == [
        "more/dup.yaml:5: Cluster/c1: metadata.name: duplicate Cluster 'c1' (first defined at clusters/c1.yaml:4)",
    ]


def test_node_references(repo):
    write(repo, "nodes.yaml", """
        apiVersion: gitops.infra/v1alpha1
        kind: Node
        metadata:
          name: orphan
        spec:
          cluster: c9
          role: controlplane
        ---
        apiVersion: gitops.infra/v1alpha1
        kind: Node
        metadata:
          name: c1-cp-2
        spec:
          cluster: c1
          role: controlplane
          hypervisor: hv-7
        ---
        apiVersion: gitops.infra/v1alpha1
        kind: Node
        metadata:
          name: c1-ingress-2
        spec:
          cluster: c1
          role: controlplane-ingress
          hypervisor: hv-1
        """)
    assert errors(repo) == [
        "clusters/c1.yaml:4: Cluster/c1: metadata.name: Cluster 'c1' has 2 ingress Nodes, so it is reached through a "
        "virtual IP: pin one (spec.apiServer.virtualIP) or give gitops.yaml a pool (spec.ingress.virtualIPs)",
        "nodes.yaml:6: Node/orphan: spec.cluster: Cluster 'c9' does not exist (defined: c1)",
        "nodes.yaml:16: Node/c1-cp-2: spec.hypervisor: Hypervisor 'hv-7' does not exist (defined: edge-1, hv-1)",
        # a second ingress node needs a second public hypervisor too
        "nodes.yaml:24: Node/c1-ingress-2: spec.role: Cluster 'c1' has 2 controlplane-ingress Nodes, and they sit on "
        "distinct public Hypervisors, but the repo has 1 open to new nodes (defined: edge-1): add a public "
        "Hypervisor or remove an ingress Node",
        "nodes.yaml:25: Node/c1-ingress-2: spec.hypervisor: role controlplane-ingress runs on public hypervisors, "
        "but Hypervisor 'hv-1' is private",
    ]


def test_addresses_and_port_ranges(repo):
    write(repo, "hv2.yaml", """
        apiVersion: gitops.infra/v1alpha1
        kind: Hypervisor
        metadata:
          name: hv-2
        spec:
          ipAddress: 127.0.30.1
          portRange: {low: 30050, high: 30200}
          localCRIEndpoint: {criEndpointPath: /run/hv-2.sock}
        ---
        apiVersion: gitops.infra/v1alpha1
        kind: Hypervisor
        metadata:
          name: hv-3
        spec:
          ipAddress: 300.1.2.3
          portRange: {low: 31000, high: 30000}
          localCRIEndpoint: {criEndpointPath: /run/hv-3.sock}
        """)
    assert errors(repo) == [
        "hv2.yaml:7: Hypervisor/hv-2: spec.portRange: ports 30050-30200 on 127.0.30.1 overlap Hypervisor 'hv-1' "
        "(30000-30100, hypervisors.yaml:8)",
        "hv2.yaml:15: Hypervisor/hv-3: spec.ipAddress: '300.1.2.3' is not an IP address",
        "hv2.yaml:16: Hypervisor/hv-3: spec.portRange: low (31000) is greater than high (30000)",
    ]


def test_remote_endpoint_tls_material(repo):
    ca, ca_key = make_cert("ca", ca=True)
    client, client_key = make_cert("client", issuer_key=ca_key, issuer=ca)
    _, other_key = make_cert("other")
    allow_plaintext(repo)  # the keys themselves are under test here (tests/test_repo_secrets.py: encrypted)
    write(repo, "good.yaml", remote_hypervisor_yaml("remote-ok", pem_cert(ca), pem_cert(client), pem_key(client_key)))
    assert errors(repo) == []
    write(repo, "mismatch.yaml", remote_hypervisor_yaml(
        "remote-mismatch", pem_cert(ca), pem_cert(client), pem_key(other_key), ip="127.0.30.10"))
    write(repo, "notca.yaml", remote_hypervisor_yaml(
        "remote-notca", pem_cert(client), "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----",
        "not a key", ip="127.0.30.11"))
    found = errors(repo)
    key_line = line_of(repo / "mismatch.yaml", "privateKey:")
    assert f"mismatch.yaml:{key_line}: Hypervisor/remote-mismatch: spec.remoteCRIEndpoint.clientCertificate." \
           "privateKey: private key does not match clientCertificate.certificate" in found
    ca_line = line_of(repo / "notca.yaml", "caCertificate:")
    assert f"notca.yaml:{ca_line}: Hypervisor/remote-notca: spec.remoteCRIEndpoint.caCertificate: " \
           "certificate is not a CA (basicConstraints ca=false)" in found
    cert_line = line_of(repo / "notca.yaml", "certificate: |")
    key_line = line_of(repo / "notca.yaml", "privateKey:")
    assert f"notca.yaml:{cert_line}: Hypervisor/remote-notca: spec.remoteCRIEndpoint.clientCertificate." \
           "certificate: not a PEM certificate (expected one -----BEGIN CERTIFICATE----- block)" in found
    assert f"notca.yaml:{key_line}: Hypervisor/remote-notca: spec.remoteCRIEndpoint.clientCertificate." \
           "privateKey: not a PEM private key (unencrypted PKCS#8, PKCS#1 or SEC1)" in found
    assert len(found) == 4


def data_dir_hypervisor(repo: Path, data_dir: str) -> Path:
    return write(repo, "hv-data.yaml", f"""
        apiVersion: gitops.infra/v1alpha1
        kind: Hypervisor
        metadata:
          name: hv-data
          annotations:
            gitops.infra/data-dir: "{data_dir}"
        spec:
          ipAddress: 127.0.30.20
          portRange: {{low: 30000, high: 30100}}
          localCRIEndpoint: {{criEndpointPath: /run/hv-data.sock}}
        """)


@pytest.mark.parametrize("data_dir, why", [
    ("../../etc", "'../../etc' is not an absolute path (e.g. /var/lib/gitops)"),
    ("relative/dir", "'relative/dir' is not an absolute path (e.g. /var/lib/gitops)"),
    ("/var/lib/../x", "'/var/lib/../x' is not a normalized path (write '/var/x')"),
    ("/var/lib/gitops/", "'/var/lib/gitops/' is not a normalized path (write '/var/lib/gitops')"),
    ("/", "'/' is not allowed: use a directory of its own, e.g. /var/lib/gitops"),
])
def test_data_dir_annotation_must_be_absolute_and_normalized(repo, data_dir, why):
    path = data_dir_hypervisor(repo, data_dir)
    line = line_of(path, "gitops.infra/data-dir:")
    assert errors(repo) == [
        f"hv-data.yaml:{line}: Hypervisor/hv-data: metadata.annotations.gitops.infra/data-dir: {why}"]


def test_absolute_data_dir_annotation_reaches_the_model(repo):
    data_dir_hypervisor(repo, "/srv/gitops-data")
    result = validate_repo(repo)
    assert [str(d) for d in result.diagnostics] == []
    assert result.model.hypervisors["hv-data"].data_dir == "/srv/gitops-data"
    assert result.model.hypervisors["hv-1"].data_dir == "/var/lib/gitops"


def test_cluster_networks(repo):
    write(repo, "c3.yaml", """
        apiVersion: gitops.infra/v1alpha1
        kind: Cluster
        metadata:
          name: c3
        spec:
          kubernetesVersion: v1.36.0
          serviceCIDR: 10.96.0.1/12
          podCIDR: 10.0.0.0/8
          apiServer:
            endpointHosts: [api.example.com, "bad host!"]
          certificates: {validityDays: 30, renewBeforeDays: 60}
        ---
        apiVersion: gitops.infra/v1alpha1
        kind: Cluster
        metadata:
          name: c4
        spec:
          kubernetesVersion: v1.36.0
          serviceCIDR: 10.96.0.0/12
          podCIDR: 10.0.0.0/8
        """)
    assert errors(repo) == [
        "c3.yaml:7: Cluster/c3: spec.serviceCIDR: '10.96.0.1/12' is not a CIDR: 10.96.0.1/12 has host bits set",
        "c3.yaml:10: Cluster/c3: spec.apiServer.endpointHosts[1]: 'bad host!' is neither a DNS name nor an IP",
        "c3.yaml:11: Cluster/c3: spec.certificates.renewBeforeDays: renewal window (60 days) must be shorter than "
        "validity (30 days)",
        "c3.yaml:20: Cluster/c4: spec.podCIDR: pod network 10.0.0.0/8 overlaps service network 10.96.0.0/12",
    ]


def test_api_server_extra_args(repo):
    write(repo, "c5.yaml", """
        apiVersion: gitops.infra/v1alpha1
        kind: Cluster
        metadata:
          name: c5
        spec:
          kubernetesVersion: v1.37.2
          apiServer:
            extraArgs:
              event-ttl: 2h0m0s
              secure-port: "443"
              insecure-port: "0"
        ---
        apiVersion: gitops.infra/v1alpha1
        kind: Cluster
        metadata:
          name: c6
        spec:
          kubernetesVersion: v1.37.2
          apiServer:
            extraArgs:
              --dashes: "x"
              spaced: "a b"
        """)
    found = errors(repo)
    assert "c5.yaml:10: Cluster/c5: spec.apiServer.extraArgs.secure-port: --secure-port is set by gitops itself and " \
           "cannot be overridden" in found, found
    assert "c5.yaml:11: Cluster/c5: spec.apiServer.extraArgs.insecure-port: --insecure-port was removed from " \
           "kube-apiserver in Kubernetes 1.24: the API server would not start" in found, found
    assert [e for e in found if "'--dashes'" in e and "does not match" in e], found
    assert [e for e in found if "'a b'" in e and "does not match" in e], found
    write(repo, "c5.yaml", """
        apiVersion: gitops.infra/v1alpha1
        kind: Cluster
        metadata:
          name: c5
        spec:
          kubernetesVersion: v1.37.2
          apiServer:
            extraArgs: {max-requests-inflight: "500", event-ttl: 2h0m0s}
        """)
    result = validate_repo(repo)
    assert [str(d) for d in result.diagnostics] == []
    assert result.model.clusters["c5"].api_server_args == (("event-ttl", "2h0m0s"), ("max-requests-inflight", "500"))


def test_api_server_oidc(repo):
    """spec.apiServer.oidc: an https issuer, a client, PEM certificates for its CA; its flags are gitops's."""
    write(repo, "c7.yaml", """
        apiVersion: gitops.infra/v1alpha1
        kind: Cluster
        metadata:
          name: c7
        spec:
          kubernetesVersion: v1.37.2
          apiServer:
            oidc:
              issuerURL: http://auth.example.test
              clientID: kubernetes
        ---
        apiVersion: gitops.infra/v1alpha1
        kind: Cluster
        metadata:
          name: c8
        spec:
          kubernetesVersion: v1.37.2
          apiServer:
            oidc:
              issuerURL: https://auth.example.test/dex
              clientID: kubernetes
              caBundle: not a certificate
            extraArgs:
              oidc-issuer-url: https://elsewhere.test
        """)
    found = errors(repo)
    assert [e for e in found if e.startswith("c7.yaml:9: Cluster/c7: spec.apiServer.oidc.issuerURL: "
                                             "'http://auth.example.test' is invalid")], found
    assert "c7.yaml:22: Cluster/c8: spec.apiServer.oidc.caBundle: not PEM certificates (expected -----BEGIN " \
           "CERTIFICATE----- blocks)" in found, found
    assert "c7.yaml:24: Cluster/c8: spec.apiServer.extraArgs.oidc-issuer-url: --oidc-issuer-url is set by gitops " \
           "itself and cannot be overridden" in found, found
    from gitops.pki import create_ca

    ca = create_ca("issuer-ca").cert_pem
    bundle = "\n".join("                " + line for line in ca.splitlines())
    write(repo, "c7.yaml", f"""
        apiVersion: gitops.infra/v1alpha1
        kind: Cluster
        metadata:
          name: c7
        spec:
          kubernetesVersion: v1.37.2
          apiServer:
            oidc:
              issuerURL: https://auth.example.test/dex
              clientID: kubernetes
              groupsPrefix: "oidc:"
              caBundle: |
{bundle}
        """)
    result = validate_repo(repo)
    assert [str(d) for d in result.diagnostics] == []
    oidc = result.model.clusters["c7"].oidc
    assert (oidc.issuer_url, oidc.username_claim, oidc.groups_claim, oidc.groups_prefix, oidc.ca_bundle) == (
        "https://auth.example.test/dex", "email", "groups", "oidc:", ca)


def test_sip_auth_users_and_clients(repo):
    """services.auth: a password hash, never a password; each name, email and client id once; a code-flow client
    has redirect URIs."""
    from gitops.oidc.passwords import hash_password

    hashed = hash_password("pw")
    write(repo, "t9.yaml", f"""
        apiVersion: gitops.infra/v1alpha1
        kind: SIPCluster
        metadata:
          name: t9
        spec:
          nodes:
            ControlPlane:
              count: {{active: 1}}
          services:
            auth:
              users:
                - {{username: alice, email: alice@example.com, passwordHash: hunter2}}
                - {{username: bob, email: ALICE@example.com, passwordHash: "{hashed}", groups: [devs]}}
              clients:
                - {{id: kubernetes, grantTypes: [password]}}
        ---
        apiVersion: gitops.infra/v1alpha1
        kind: SIPCluster
        metadata:
          name: t10
        spec:
          nodes:
            ControlPlane:
              count: {{active: 1}}
          services:
            auth:
              clients:
                - {{id: web, redirectURIs: ["http://evil.test/cb"]}}
        ---
        apiVersion: gitops.infra/v1alpha1
        kind: SIPCluster
        metadata:
          name: t11
        spec:
          nodes:
            ControlPlane:
              count: {{active: 1}}
          services:
            auth:
              clients:
                - {{id: web, redirectURIs: ["http://localhost:@evil.example/cb", "https://app.test/cb"]}}
        """)
    found = errors(repo)
    assert "t9.yaml:12: SIPCluster/t9: spec.services.auth.users[0].passwordHash: not a bcrypt ($2b$...) or argon2id " \
           "($argon2id$...) hash: a password is never written in the repo; put its hash (gitops oidc hash-password)" \
           in found, found
    assert "t9.yaml:13: SIPCluster/t9: spec.services.auth.users[1].email: 'ALICE@example.com' is also the email " \
           "of users[0]" in found, found
    assert [e for e in found
            if e.startswith("t9.yaml:28: SIPCluster/t10: spec.services.auth.clients[0].redirectURIs[0]")
            and "http://evil.test/cb" in e], found  # (schema: https, or http on loopback only)
    assert "t9.yaml:41: SIPCluster/t11: spec.services.auth.clients[0].redirectURIs[0]: " \
           "'http://localhost:@evil.example/cb' carries user info: a redirect URI names a host only" in found, found
    assert len(found) == 4, found
    write(repo, "t9.yaml", f"""
        apiVersion: gitops.infra/v1alpha1
        kind: SIPCluster
        metadata:
          name: t9
        spec:
          nodes:
            ControlPlane:
              count: {{active: 1}}
          services:
            auth:
              users:
                - {{username: bob, email: bob@example.com, passwordHash: "{hashed}", groups: [devs]}}
              clients:
                - {{id: kubernetes, grantTypes: [password]}}
                - {{id: kubernetes, redirectURIs: ["https://app.test/cb"]}}
                - {{id: web}}
        """)
    found = errors(repo)
    assert found == [
        "t9.yaml:15: SIPCluster/t9: spec.services.auth.clients[1].id: 'kubernetes' is also the id of clients[0]",
        "t9.yaml:16: SIPCluster/t9: spec.services.auth.clients[2]: a client of the code flow (grantTypes "
        "authorization_code) needs redirectURIs"], found


# --- files that are not good YAML ------------------------------------------------------

def test_bad_files_are_reported_and_everything_else_still_checked(repo):
    write(repo, "dupkeys.yaml", """
        apiVersion: gitops.infra/v1alpha1
        kind: Cluster
        metadata:
          name: c5
        spec:
          kubernetesVersion: "1.36.0"
          kubernetesVersion: "1.36.0"
        """)
    (repo / "bomb.yaml").write_text(billion_laughs())
    (repo / "binary.yml").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    write(repo, "notes.yaml", "just some words: that: do not parse\n")
    write(repo, "scalar.yaml", "- a list\n- not a document\n")
    write(repo, "README.md", "# not YAML, not read\n")
    write(repo, "nodes2.yaml", """
        apiVersion: gitops.infra/v1alpha1
        kind: Node
        metadata:
          name: c1-cp-3
        spec:
          cluster: c1
          role: controlplane
          hypervisor: ghost
        """)
    found = errors(repo)
    assert found[0] == "binary.yml:1: binary file (contains NUL bytes), not YAML"
    assert found[1] == ("bomb.yaml:1: document expands to more than 1000000 nodes (alias bomb?); "
                        "refusing to load it")
    assert found[2] == "dupkeys.yaml:7: spec.kubernetesVersion: duplicate key 'kubernetesVersion' (first at line 6)"
    assert found[3] == "nodes2.yaml:8: Node/c1-cp-3: spec.hypervisor: Hypervisor 'ghost' does not exist " \
                       "(defined: edge-1, hv-1)"
    assert found[4].startswith("notes.yaml:1: invalid YAML: mapping values are not allowed")
    assert found[5] == "scalar.yaml:1: document is not a mapping (expected apiVersion, kind, metadata, spec)"
    assert len(found) == 6
    assert validate_repo(repo).model is None


def test_symlink_out_of_the_repo_is_refused(repo, tmp_path):
    outside = write(tmp_path, "outside/secret.yaml", "a: 1\n")
    (repo / "link.yaml").symlink_to(outside)
    assert errors(repo) == ["link.yaml:1: symlink points outside the repo; refusing to read it"]


def test_the_command_quiets_grpc_when_it_runs_not_when_it_is_imported():
    """Importing gitops.cli changes no environment; running a command sets GRPC_VERBOSITY before grpc loads."""
    code = ("import os, sys\n"
            "from click.testing import CliRunner\n"
            "import gitops.cli\n"
            "print(os.environ.get('GRPC_VERBOSITY'), 'grpc' in sys.modules)\n"
            "result = CliRunner().invoke(gitops.cli.cli, ['schema', 'Node'])\n"
            "print(result.exit_code, os.environ.get('GRPC_VERBOSITY'))\n")
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.splitlines() == ["None False", "0 NONE"]


def test_a_clusters_ingress_nodes_must_fit_on_distinct_public_hypervisors(repo):
    """issue #44.1: two ingress Nodes with one public Hypervisor, and two pinned to the same one, are refused at
    the Node's file and line; a second open public Hypervisor makes the same repo valid."""
    write(repo, "gitops.yaml", """
        apiVersion: gitops.infra/v1alpha1
        kind: GitopsConfig
        spec:
          ingress:
            virtualIPs: [127.0.31.0/29]
        """)
    nodes = write(repo, "clusters/c1-ingress-2.yaml", """
        apiVersion: gitops.infra/v1alpha1
        kind: Node
        metadata:
          name: c1-ingress-2
        spec:
          cluster: c1
          role: controlplane-ingress
        """)
    assert errors(repo) == [
        f"{nodes.relative_to(repo)}:{line_of(nodes, 'role:')}: Node/c1-ingress-2: spec.role: Cluster 'c1' has 2 "
        "controlplane-ingress Nodes, and they sit on distinct public Hypervisors, but the repo has 1 open to new "
        "nodes (defined: edge-1): add a public Hypervisor or remove an ingress Node"]
    edge_2 = """
        ---
        apiVersion: gitops.infra/v1alpha1
        kind: Hypervisor
        metadata:
          name: edge-2
        spec:
          public: true
          {cordoned}
          ipAddress: 127.0.30.3
          portRange: {{low: 30000, high: 30100}}
          localCRIEndpoint:
            criEndpointPath: /run/edge-2.sock
        """
    hypervisors = (repo / "hypervisors.yaml").read_text()
    (repo / "hypervisors.yaml").write_text(hypervisors + edge_2.format(cordoned="cordoned: true").replace("\n        ", "\n"))
    assert len(errors(repo)) == 1  # a cordoned one takes no new node
    (repo / "hypervisors.yaml").write_text(hypervisors + edge_2.format(cordoned="").replace("\n        ", "\n"))
    assert errors(repo) == []
    nodes.write_text(nodes.read_text() + "  hypervisor: edge-1\n")
    assert errors(repo) == [
        f"{nodes.relative_to(repo)}:{line_of(nodes, 'hypervisor:')}: Node/c1-ingress-2: spec.hypervisor: Node "
        "'c1-ingress' of Cluster 'c1' is an ingress Node pinned to Hypervisor 'edge-1' too: a cluster's ingress "
        "Nodes sit on distinct public Hypervisors"]


@pytest.mark.parametrize(("kubelet", "apiserver", "words"), [
    ("v1.37.2", "v1.37.2", None), ("v1.34.0", "v1.37.2", None), ("v1.36.3", "v1.37.0", None),
    ("v1.38.0", "v1.37.2", "kubelet v1.38.0 is newer than the cluster's API server v1.37.2"),
    ("v1.37.2", "v1.36.3", "kubelet v1.37.2 is newer than the cluster's API server v1.36.3"),
    ("v1.33.9", "v1.37.2", "kubelet v1.33.9 is more than 3 minor versions older"),
    # a build's or a distribution's suffix is read past (the skew is the release's); no release is refused
    ("v1.37.2-dirty", "v1.37.2", None), ("v1.38.0+k3s1", "v1.37.2", "kubelet v1.38.0+k3s1 is newer"),
    ("1.37", "v1.37.2", "not a Kubernetes version"), ("v1.37.x", "v1.37.2", "not a Kubernetes version"),
])
def test_a_kubelet_newer_than_the_api_server_or_too_old_is_refused_naming_the_node(kubelet, apiserver, words):
    from gitops.model import versions

    why = versions.kubelet_skew_problem("worker-1", kubelet, apiserver)
    if words is None:
        assert why is None
    else:
        assert why is not None and why.startswith("node worker-1: ") and words in why, why
