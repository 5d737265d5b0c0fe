"""Hostile content (issue #27): YAML amplification, output injection and floods, hidden private keys,
recipients from another repo, and values the rules must bound.

Every case runs the `gitops` command and asserts its exit code, its message, no traceback, a
time bound and a peak-RSS bound (see `hostile.py`).
"""
from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest

from hostile import HYPERVISOR, Case, Ran, assert_table, config_yaml, repo_with
from pyrage import x25519
from repo_helpers import make_cert, minimal_repo, pem_cert, pem_key, remote_hypervisor_yaml, write

from gitops.model.secretfields import private_key_in
from gitops.plan.render import safe
from gitops.printable import printable

MiB = 1024 * 1024


def validate(files: dict[str, str | bytes], config: str | None = None, *extra: str):
    def setup(tmp: Path) -> list[str]:
        repo_with(tmp, files, config)
        return ["validate", "repo", *extra]
    return setup


def on_minimal(files: dict[str, str]):
    """The minimal valid repo of repo_helpers plus `files`."""
    def setup(tmp: Path) -> list[str]:
        repo = minimal_repo(tmp / "repo")
        for rel, text in files.items():
            write(repo, rel, text)
        return ["validate", "repo"]
    return setup


def laughs(levels: int, width: int = 9) -> str:
    lines = ["kind: Secret", "apiVersion: v1", "metadata: {name: s}", "stringData:",
             '  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"  l{i}: &l{i} [" + ",".join([f"*{'a' if i == 1 else f'l{i - 1}'}"] * width) + "]")
    return "\n".join(lines) + "\n"


def raw_controls_absent(_tmp: Path, ran: Ran) -> None:
    for char in "\x1b\r\x00\x07":
        assert char not in ran.output, repr(ran.output[:500])
    assert not any(line.startswith("fake.yaml") for line in ran.output.splitlines()), ran.output


def json_capped(_tmp: Path, ran: Ran) -> None:
    payload = json.loads(ran.out)
    assert payload["valid"] is False and payload["errorCount"] == 5_000
    assert len(payload["errors"]) == 50


def long_lines_shortened(_tmp: Path, ran: Ran) -> None:
    assert max(map(len, ran.output.splitlines())) < 1000


BIG_VALUE = "x" * (6 * MiB)
#: 6 MiB of one string, then 100,000 aliases of it: 7 MB of text, 100,000 nodes, 600 GB expanded
ALIASES = ("kind: Secret\napiVersion: v1\nmetadata: {name: s}\nstringData:\n  big: &big " + BIG_VALUE
           + "\n  many: [" + ",".join(["*big"] * 100_000) + "]\n")

AMPLIFICATION = [
    # HIGH: many aliases of one large string: refused while loading, so no later pass walks 600 GB
    Case("aliases-of-a-large-string", validate({"a.yaml": ALIASES}), 1,
         ("a.yaml:5: document expands to more than 16 MiB of text",)),
    Case("aliases-of-a-large-string-secrets-list",
         lambda tmp: (repo_with(tmp, {"a.yaml": ALIASES}), ["secrets", "list", "repo"])[1], 1,
         ("a.yaml:5: document expands to more than 16 MiB",)),
    Case("aliases-in-gitops-yaml", validate({}, "kind: GitopsConfig\nspec:\n  statusBranch: &b " + BIG_VALUE
                                            + "\n  paths: [" + ",".join(["*b"] * 100) + "]\n"), 1,
         ("gitops.yaml:3: document expands to more than 16 MiB",)),
    # (past the node limit: test_yamlload's billion laughs) under it: loads, and every pass over the
    # ~600,000 nodes stays bounded
    Case("laughs-under-the-node-limit", validate({"l.yaml": laughs(6)}), 1,
         ("l.yaml:10: Secret/s: stringData.l5: [[[[[['lol'", "invalid: 6 error(s) in 1 file(s)"),
         check=long_lines_shortened),
    Case("recursive-alias", validate({"r.yaml": "a: &a [*a]\n"}), 1, ("nesting deeper than 64 levels",)),
    Case("deep-nesting", validate({"d.yaml": "[" * 50_000 + "]" * 50_000}), 1, ("d.yaml:1: invalid YAML: exceeded maximum nesting depth",)),
]


def test_yaml_amplification_is_bounded_in_every_pass(tmp_path: Path) -> None:
    assert_table(AMPLIFICATION, tmp_path)


# --- what is printed: control characters escaped, floods capped ---------------------------

EVIL_NAME = "evil\nfake.yaml:1: Hypervisor/x: all good\r\x1b[2J\x07.yaml"
FLOOD = "[1]\n---\n" * 5_000
HYPERVISOR_1 = HYPERVISOR.format(name="hv-1", ip="10.0.0.1")

OUTPUT = [
    # MEDIUM: a name cannot inject a fake line, nor clear the terminal
    Case("control-characters-in-a-file-name", validate({EVIL_NAME: "kind: Nope\n"}), 1,
         ("evil\\nfake.yaml:1: Hypervisor/x: all good\\r\\x1b[2J\\x07.yaml:1:",), check=raw_controls_absent),
    Case("control-characters-in-a-key", validate({"k.yaml": HYPERVISOR_1 + '  "bad\\e[31m\\0key\\r": 1\n'}), 1,
         ("spec.bad\\x1b[31m\\x00key\\r: unknown field",), check=raw_controls_absent),
    Case("control-characters-in-secrets-list",
         lambda tmp: (repo_with(tmp, {"h.yaml": HYPERVISOR_1.replace("name: hv-1", 'name: "hv\\e[2J\\rfake"')
                                      + "  remoteCRIEndpoint: {clientCertificate: {privateKey: x}}\n"}),
                      ["secrets", "list", "repo"])[1], 0,
         ("Hypervisor/hv\\x1b[2J\\rfake: spec.remoteCRIEndpoint.clientCertificate.privateKey: PLAINTEXT",),
         check=raw_controls_absent),
    # MEDIUM: floods are capped: the first 50 errors, then how many more
    Case("a-7-mib-value-is-shortened", validate({"v.yaml": HYPERVISOR_1.replace("10.0.0.1", "x" * (7 * MiB))}), 1,
         ("spec.ipAddress: 'xxxx", "more characters)"), check=long_lines_shortened, max_lines=5),
    Case("200000-documents-refused-in-one-line", validate({"f.yaml": "[1]\n---\n" * 200_000}), 1,
         ("f.yaml:20001: more than 10000 documents in one file",), max_lines=2),
    Case("2000000-empty-documents-refused", validate({"e.yaml": "---\n" * 2_000_000}), 1,
         ("e.yaml:", "more than 10000 documents in one file",), max_lines=2),
    Case("5000-errors-give-52-lines", validate({"f.yaml": FLOOD}), 1,
         ("f.yaml:1: document is not a mapping", "... and 4950 more error(s) not shown",
          "invalid: 5000 error(s) in 1 file(s)"), max_lines=52),
    Case("5000-errors-as-json", validate({"f.yaml": FLOOD}, None, "-o", "json"), 1, ('"errorCount": 5000',),
         check=json_capped),
]


def test_output_is_escaped_and_capped(tmp_path: Path) -> None:
    assert_table(OUTPUT, tmp_path)


# --- private keys the detector must see; recipients from another repo ---------------------

_, KEY = make_cert("k")
PEM = pem_key(KEY)
PGP = "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF0AAAAB\n-----END PGP PRIVATE KEY BLOCK-----\n"
AGE_KEY = str(x25519.Identity.generate())
RECIPIENT = str(x25519.Identity.generate().to_public())


def annotated(value: str) -> str:
    """A Hypervisor carrying `value` in an annotation (a field that is no secret field)."""
    block = "".join(f"      {line}\n" for line in value.splitlines())
    return HYPERVISOR_1.replace("  name: hv-1\n", "  name: hv-1\n  annotations:\n    note: |\n" + block)


def secret_data(value: str) -> str:
    return f"apiVersion: v1\nkind: Secret\nmetadata: {{name: tls}}\ndata:\n  tls.key: {value}\n"


def pem_as_key(_: str = "") -> str:
    return HYPERVISOR_1.replace("  name: hv-1\n", "  name: hv-1\n  labels:\n    ? |\n"
                                + "".join(f"      {line}\n" for line in PEM.splitlines()) + "    : x\n")


def encrypt_setup(target: str, git: bool):
    """tmp/parent/gitops.yaml lists a recipient; tmp/parent/repo has none (a git checkout if `git`)."""
    def setup(tmp: Path) -> list[str]:
        parent = tmp / "parent"
        repo = parent / "repo"
        ca, ca_key = make_cert("ca", ca=True)
        cert, key = make_cert("client", ca_key, ca)
        write(repo, "hv.yaml", remote_hypervisor_yaml("hv-r", pem_cert(ca), pem_cert(cert), pem_key(key)))
        write(parent, "gitops.yaml", config_yaml(f"  secrets:\n    recipients: [{RECIPIENT}]\n"))
        if git:
            (repo / ".git").mkdir()
        return ["secrets", "encrypt", str(repo / target) if target else str(repo)]
    return setup


def unchanged(tmp: Path, _ran: Ran) -> None:
    assert "BEGIN AGE ENCRYPTED FILE" not in (tmp / "parent" / "repo" / "hv.yaml").read_text()


SECRETS = [
    Case("pgp-private-key-block", validate({"p.yaml": annotated(PGP)}), 1,
         ("metadata.annotations.note: plaintext PGP private key in the repo",)),
    Case("age-secret-key", validate({"a.yaml": annotated(f"identity: {AGE_KEY}")}), 1,
         ("metadata.annotations.note: plaintext age identity (AGE-SECRET-KEY-1...) in the repo",)),
    Case("pem-key-as-a-mapping-key", validate({"k.yaml": pem_as_key()}), 1,
         ("plaintext private key in the repo",)),
    Case("base64-of-a-pem-key", validate({"s.yaml": secret_data(base64.b64encode(PEM.encode()).decode())}), 1,
         ("Secret/tls: data.tls.key: plaintext base64-encoded private key in the repo",)),
    Case("base64-of-a-certificate-is-fine",
         validate({"s.yaml": secret_data(base64.b64encode(pem_cert(make_cert("c")[0]).encode()).decode())}), 0,
         ("ok: repo",)),
    Case("allowed-plaintext-warns", validate({"p.yaml": annotated(PGP)}, config_yaml("  secrets: {allowPlaintext: true}\n")),
         0, ("warning: p.yaml:", "plaintext PGP private key (allowed by spec.secrets.allowPlaintext")),
    # MEDIUM: recipients never come from a gitops.yaml above the repo
    Case("encrypt-repo-ignores-a-parent-gitops-yaml", encrypt_setup("", git=False), 1,
         ("no gitops.yaml found in the repo",), check=unchanged),
    Case("encrypt-file-stops-at-the-checkout-top", encrypt_setup("hv.yaml", git=True), 1,
         ("no gitops.yaml found in the repo",), check=unchanged),
]


def test_private_keys_are_found_and_recipients_stay_in_the_repo(tmp_path: Path) -> None:
    assert_table(SECRETS, tmp_path)


# --- values the rules bound -------------------------------------------------------------

def data_dir(value: str) -> str:
    return HYPERVISOR_1.replace("  name: hv-1\n", f"  name: hv-1\n  annotations:\n    gitops.infra/data-dir: {value}\n")


def controlplane_nodes(count: int) -> str:
    return "".join(f"---\napiVersion: gitops.infra/v1alpha1\nkind: Node\nmetadata: {{name: c1-cp-{i}}}\n"
                   f"spec: {{cluster: c1, role: controlplane}}\n" for i in range(2, count + 1))


def sip(count: int, label: str = "control-plane") -> str:
    return ("apiVersion: gitops.infra/v1alpha1\nkind: SIPCluster\nmetadata: {name: t}\nspec:\n  nodes:\n"
            f"    ControlPlane:\n      count: {{active: {count}}}\n"
            f"      labelSelector: {{matchLabels: {{flavor: {label}}}}}\n"
            "  services:\n    loadBalancer: {port: 30443, targetPort: 6443}\n")


def labelled(key: str, value: str) -> str:
    return HYPERVISOR_1.replace("  name: hv-1\n", f"  name: hv-1\n  labels:\n    {key}: {value}\n")


PATHS_CONFIG = config_yaml("  # where the resources are\n  statusBranch: s\n  paths:\n    - hv\n    - missing\n")

RULES = [
    Case("ipv6-address", validate({"h.yaml": HYPERVISOR_1.replace("10.0.0.1", "'::1'")}), 1,
         ("h.yaml:6: Hypervisor/hv-1: spec.ipAddress: '::1' is an IPv6 address; only IPv4 is supported",)),
    Case("spec-paths-error-at-its-line", validate({"hv/h.yaml": HYPERVISOR_1}, PATHS_CONFIG), 1,
         ("gitops.yaml:8: GitopsConfig: spec.paths[1]: 'missing' does not exist",)),
    Case("data-dir-etc", validate({"h.yaml": data_dir("/etc")}), 1, ("'/etc' is a system directory",)),
    Case("data-dir-proc", validate({"h.yaml": data_dir("/proc/1")}), 1, ("'/proc/1' is a system directory",)),
    Case("data-dir-double-slash", validate({"h.yaml": data_dir("//etc")}), 1,
         ("'//etc' is not a normalized path (write '/etc')",)),
    Case("data-dir-newline", validate({"h.yaml": data_dir('"/var/lib/x\\nrm -rf /"')}), 1,
         ("'/var/lib/x\\nrm -rf /' holds a control character",)),
    Case("data-dir-of-its-own-is-fine", validate({"h.yaml": data_dir("/var/lib/gitops")}), 0, ("ok: repo",)),
    Case("eight-controlplane-nodes", on_minimal({"more.yaml": controlplane_nodes(8)}), 1,
         ("more.yaml:", "Node/c1-cp-8: spec.role: Cluster 'c1' has more than 7 controlplane Nodes",),
         never=("c1-cp-7: spec.role",)),
    Case("sip-count-bounded", validate({"s.yaml": sip(10**9)}), 1,
         ("spec.nodes.ControlPlane.count.active: 1000000000 is greater than the maximum of 1000",)),
    Case("label-value-too-long", validate({"h.yaml": labelled("rack", "r" * 64)}), 1,
         ("metadata.labels.rack: '" + "r" * 64 + "' is too long",)),
    Case("label-value-bad-characters", validate({"h.yaml": labelled("rack", "'-r 1-'")}), 1,
         ("metadata.labels.rack: '-r 1-' is invalid: Kubernetes label value",)),
    Case("label-key-bad-characters", validate({"h.yaml": labelled("'bad key!'", "r1")}), 1,
         ("'bad key!' is invalid: Kubernetes label key",)),
    Case("selector-value-checked", validate({"s.yaml": sip(1, "'a b'")}), 1,
         ("matchLabels.flavor: 'a b' is invalid: Kubernetes label value",)),
    Case("host-name-checked", validate({"b.yaml": "apiVersion: metal3.io/v1alpha1\nkind: BareMetalHost\n"
                                                  'metadata: {name: "h\\e[2J"}\nspec: {online: true}\n'}), 1,
         ("metadata.name: 'h\\x1b[2J' is invalid: DNS-1123 subdomain",), check=raw_controls_absent),
]


def test_rules_bound_what_the_schema_allowed(tmp_path: Path) -> None:
    assert_table(RULES, tmp_path)


def test_plan_text_escapes_markup_and_control_characters():
    assert safe("n\x1b[2J[bold]x\r\n") == "n\\x1b[2J\\[bold]x\\r\\n"
    assert printable("a\tb\x00\u2028", keep_newlines=True) == "a\\tb\\x00\\u2028"
    assert printable("one\ntwo\x1b", keep_newlines=True) == "one\ntwo\\x1b"


@pytest.mark.parametrize("text, found", [
    (PEM, "private key"),
    (PGP, "PGP private key"),
    (f"# created: today\n{AGE_KEY}\n", "age identity (AGE-SECRET-KEY-1...)"),
    (base64.b64encode(PEM.encode()).decode(), "base64-encoded private key"),
    (base64.encodebytes(PEM.encode()).decode(), "base64-encoded private key"),  # wrapped at 76 columns
    ("junk LS0tLS1CRUdJTi0 " + base64.b64encode(PEM.encode()).decode(), "base64-encoded private key"),
    (pem_cert(make_cert("c")[0]), ""),
    (base64.b64encode(pem_cert(make_cert("c")[0]).encode()).decode(), ""),
    ("AGE-SECRET-KEY-1 is how an identity starts", ""),
    ("-----BEGIN AGE ENCRYPTED FILE-----\n", ""),
], ids=["pem", "pgp", "age-identity", "base64", "base64-wrapped", "base64-after-junk", "certificate",
        "base64-certificate", "age-prefix-in-prose", "age-armor"])  # (keys made per run: ids must not show them)
def test_private_key_detector(text, found):
    assert private_key_in(text) == found


def test_private_key_detector_is_bounded_on_hostile_values():
    started = time.monotonic()
    assert private_key_in("LS0tLS1CRUdJTi " * 1_000_000) == ""
    assert private_key_in("-----BEGIN " * 1_000_000) == ""
    assert time.monotonic() - started < 2
