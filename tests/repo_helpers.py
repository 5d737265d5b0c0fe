"""Helpers to write small infra repos for validation tests."""
from __future__ import annotations

import datetime as dt
import textwrap
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_REPO = REPO_ROOT / "example-repo"


def write(root: Path, rel: str, text: str) -> Path:
    """Write dedented `text` to `root/rel` (creating directories)."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def pem_cert(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def pem_key(key) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def make_cert(cn: str, issuer_key=None, issuer: x509.Certificate | None = None, ca: bool = False):
    """A certificate and its key; self-signed unless an issuer is given."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .sign(issuer_key or key, hashes.SHA256())
    )
    return cert, key


def indent(text: str, spaces: int) -> str:
    return "".join(" " * spaces + line + "\n" for line in text.strip().splitlines())


def remote_hypervisor_yaml(name: str, ca_pem: str, cert_pem: str, key_pem: str, ip: str = "127.0.30.9") -> str:
    return (
        "apiVersion: gitops.infra/v1alpha1\nkind: Hypervisor\nmetadata:\n"
        f"  name: {name}\nspec:\n  ipAddress: {ip}\n  portRange: {{low: 40000, high: 40100}}\n"
        "  remoteCRIEndpoint:\n    criEndpointURI: tcp://127.0.30.9:7443\n    caCertificate: |\n"
        + indent(ca_pem, 6)
        + "    clientCertificate:\n      certificate: |\n" + indent(cert_pem, 8)
        + "      privateKey: |\n" + indent(key_pem, 8)
    )


def allow_plaintext(root: Path) -> Path:
    """gitops.yaml tolerating plaintext private keys (tests about the keys themselves)."""
    return write(root, "gitops.yaml", """
        apiVersion: gitops.infra/v1alpha1
        kind: GitopsConfig
        spec:
          secrets:
            allowPlaintext: true
        """)


def minimal_repo(root: Path) -> Path:
    """A small valid repo: 2 hypervisors, 1 cluster, 2 nodes."""
    write(root, "hypervisors.yaml", """
        apiVersion: gitops.infra/v1alpha1
        kind: Hypervisor
        metadata:
          name: hv-1
        spec:
          public: false
          ipAddress: 127.0.30.1
          portRange: {low: 30000, high: 30100}
          localCRIEndpoint:
            criEndpointPath: /run/hv-1.sock
        ---
        apiVersion: gitops.infra/v1alpha1
        kind: Hypervisor
        metadata:
          name: edge-1
        spec:
          public: true
          ipAddress: 127.0.30.2
          portRange: {low: 30000, high: 30100}
          localCRIEndpoint:
            criEndpointPath: /run/edge-1.sock
        """)
    write(root, "clusters/c1.yaml", """
        apiVersion: gitops.infra/v1alpha1
        kind: Cluster
        metadata:
          name: c1
        spec:
          kubernetesVersion: "1.36.3"
          serviceCIDR: 10.96.0.0/12
          podCIDR: 10.244.0.0/16
        ---
        apiVersion: gitops.infra/v1alpha1
        kind: Node
        metadata:
          name: c1-cp-1
        spec:
          cluster: c1
          role: controlplane
        ---
        apiVersion: gitops.infra/v1alpha1
        kind: Node
        metadata:
          name: c1-ingress
        spec:
          cluster: c1
          role: controlplane-ingress
          hypervisor: edge-1
        """)
    return root


def team_a_only(repo: Path, controlplane: int = 3) -> None:
    """An example repo (`gitops lab example-repo`'s) cut down to team-a with its first `controlplane` controlplane
    nodes and its ingress node: team-b and the SIPCluster go (a lab test's CPU)."""
    import shutil

    import yaml

    shutil.rmtree(repo / "clusters" / "team-b")
    shutil.rmtree(repo / "sip")
    nodes = repo / "clusters/team-a/nodes.yaml"
    kept = {f"team-a-cp-{n}" for n in range(1, controlplane + 1)}
    docs = [d for d in yaml.safe_load_all(nodes.read_text())
            if d and (d["spec"]["role"] != "controlplane" or d["metadata"]["name"] in kept)]
    nodes.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    config = yaml.safe_load((repo / "gitops.yaml").read_text())
    config["spec"]["paths"] = [p for p in config["spec"]["paths"] if p != "sip"]
    (repo / "gitops.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def add_node(repo: Path, cluster: str, name: str, role: str, hypervisor: str = "") -> None:
    """A Node document `name` in the cluster's nodes.yaml (one of that name replaced), pinned to `hypervisor` if
    given."""
    import yaml

    path = repo / "clusters" / cluster / "nodes.yaml"
    spec = {"cluster": cluster, "role": role, **({"hypervisor": hypervisor} if hypervisor else {})}
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d and d["metadata"]["name"] != name]
    docs.append({"apiVersion": "gitops.infra/v1alpha1", "kind": "Node", "metadata": {"name": name}, "spec": spec})
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
