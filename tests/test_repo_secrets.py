"""Secret fields in the repo: age-encrypted in place, decrypted in memory, refused in plaintext (issue #15).

Real age throughout: pyrage encrypts, and the `age` command decrypts what gitops wrote.
No lab: nothing here starts containerd.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from repo_helpers import make_cert, minimal_repo, pem_cert, pem_key, remote_hypervisor_yaml, write

from gitops.cli import cli
from gitops.lab.errors import LabError
from gitops.model.resources import RemoteCRIEndpoint
from gitops.model.secretedit import EditError, encrypt_fields, find_fields, rekey_fields, write_changes
from gitops.model.validate import validate_repo
from gitops.secrets import load_identities

KEY_FIELD = "spec.remoteCRIEndpoint.clientCertificate.privateKey"
KEY_PATH = ("spec", "remoteCRIEndpoint", "clientCertificate", "privateKey")


@dataclass
class Identity:
    path: Path
    text: str
    recipient: str


def new_identity(path: Path) -> Identity:
    subprocess.run(["age-keygen", "-o", str(path)], check=True, capture_output=True)
    recipient = subprocess.run(["age-keygen", "-y", str(path)], check=True, capture_output=True, text=True).stdout
    return Identity(path, path.read_text(), recipient.strip())


def config(recipients: list[str], allow_plaintext: bool = False) -> str:
    listed = "".join(f"      - {r}\n" for r in recipients)
    return ("# repo settings\napiVersion: gitops.infra/v1alpha1\nkind: GitopsConfig\nspec:\n  secrets:\n"
            f"    recipients:\n{listed}    allowPlaintext: {'true' if allow_plaintext else 'false'}\n")


@pytest.fixture
def ident(tmp_path: Path) -> Identity:
    return new_identity(tmp_path / "controller.key")


@pytest.fixture
def remote(tmp_path: Path, ident: Identity):
    """A valid repo with one remote hypervisor whose client key is in plaintext: (repo, file, key PEM)."""
    repo = minimal_repo(tmp_path / "repo")
    ca, ca_key = make_cert("ca", ca=True)
    client, client_key = make_cert("client", issuer_key=ca_key, issuer=ca)
    key = pem_key(client_key)
    text = "# a remote hypervisor; keep this comment\n" + remote_hypervisor_yaml(
        "remote-1", pem_cert(ca), pem_cert(client), key)
    path = write(repo, "hypervisors/remote.yaml", text)
    write(repo, "gitops.yaml", config([ident.recipient]))
    return repo, path, key


def encrypt_repo(repo: Path, *recipients: str) -> None:
    files = [(p.relative_to(repo).as_posix(), p) for p in sorted(repo.rglob("*.yaml")) if p.name != "gitops.yaml"]
    write_changes(encrypt_fields(files, list(recipients)))


def field_value(path: Path, name: str = "remote-1") -> str:
    doc = next(d for d in yaml.safe_load_all(path.read_text()) if d["metadata"]["name"] == name)
    return doc["spec"]["remoteCRIEndpoint"]["clientCertificate"]["privateKey"]


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def gitops(*args: str, env: dict | None = None, stdin: str | None = None):
    return CliRunner().invoke(cli, list(args), env=env, input=stdin, catch_exceptions=False)


# --- encryption in place ------------------------------------------------------------

def test_encrypted_field_is_one_armored_block_the_age_command_decrypts(remote, ident):
    repo, path, key = remote
    result = gitops("secrets", "encrypt", str(path), "--field", KEY_FIELD, "--document", "remote-1")
    assert result.exit_code == 0, result.output
    line = line_of(path, "privateKey:")
    assert f"hypervisors/remote.yaml:{line}: Hypervisor/remote-1: {KEY_FIELD}: encrypted for 1 recipient(s)" \
           in result.output
    armored = field_value(path)
    assert armored.startswith("-----BEGIN AGE ENCRYPTED FILE-----\n")
    assert armored.endswith("-----END AGE ENCRYPTED FILE-----\n")
    assert "PRIVATE KEY" not in path.read_text()
    plain = subprocess.run(["age", "-d", "-i", str(ident.path)], input=armored, capture_output=True, text=True,
                           check=True).stdout
    assert plain == key


def test_in_place_edit_keeps_every_other_byte(remote, ident):
    repo, path, _ = remote
    before = path.read_text()
    encrypt_repo(repo, ident.recipient)
    after = path.read_text()
    head = before[:before.index("privateKey:")]
    assert after.startswith(head + "privateKey: |\n        -----BEGIN AGE ENCRYPTED FILE-----\n")
    # only the key's lines changed: everything before it is identical, and the block ends the file
    assert after.endswith("        -----END AGE ENCRYPTED FILE-----\n")
    # encrypting again leaves an encrypted value alone (no churn in the diff)
    result = gitops("secrets", "encrypt", str(repo))
    assert "already encrypted" in result.output and path.read_text() == after


def test_other_scalar_styles_comments_and_list_documents(tmp_path: Path, ident):
    """A quoted value with a trailing comment, a `|-` block with a comment after it, a `kind: List` item."""
    ca, ca_key = make_cert("ca", ca=True)
    client, client_key = make_cert("client", issuer_key=ca_key, issuer=ca)
    key = pem_key(client_key)
    quoted = '"' + key.replace("\n", "\\n") + '"'
    cert = pem_cert(client).replace("\n", "\\n")
    doc = (f"kind: Hypervisor\nmetadata: {{name: q}}  # flow metadata is fine\nspec:\n  remoteCRIEndpoint:\n"
           f"    clientCertificate:\n      certificate: \"{cert}\"\n      privateKey: {quoted}  # the key\n"
           "    criEndpointURI: tcp://x:1\n")
    block = ("---\napiVersion: v1\nkind: List\nitems:\n- kind: Hypervisor\n  metadata:\n    name: b\n  spec:\n"
             "    remoteCRIEndpoint:\n      clientCertificate:\n        privateKey: |-\n"
             + "".join(f"          {line}\n" for line in key.strip().splitlines())
             + "\n        # a comment after the block\n        certificate: x\n")
    path = tmp_path / "hv.yaml"
    path.write_text(doc + block)
    changes = encrypt_fields([("hv.yaml", path)], [ident.recipient])
    assert len(changes[0].report) == 2
    write_changes(changes)
    text = path.read_text()
    assert "privateKey: |  # the key\n" in text
    assert "\n\n        # a comment after the block\n        certificate: x\n" in text
    docs = list(yaml.safe_load_all(text))
    identities = load_identities(ident.text)
    from gitops.secrets import decrypt
    assert decrypt(docs[0]["spec"]["remoteCRIEndpoint"]["clientCertificate"]["privateKey"], identities).decode() == key
    item = docs[1]["items"][0]["spec"]["remoteCRIEndpoint"]["clientCertificate"]
    assert decrypt(item["privateKey"], identities).decode() == key.strip()  # |- had no final newline
    assert item["certificate"] == "x" and docs[0]["spec"]["remoteCRIEndpoint"]["criEndpointURI"] == "tcp://x:1"


def test_values_that_cannot_be_rewritten_in_place_are_refused_and_nothing_is_written(tmp_path: Path, ident):
    flow = tmp_path / "flow.yaml"
    flow.write_text("kind: Hypervisor\nmetadata: {name: f}\nspec:\n  remoteCRIEndpoint:\n"
                    "    clientCertificate: {certificate: c, privateKey: k}\n")
    with pytest.raises(EditError, match=r"flow.yaml:5: Hypervisor/f: .*privateKey: the value is inside a flow "
                                        r"mapping .*block style"):
        encrypt_fields([("flow.yaml", flow)], [ident.recipient])
    alias = tmp_path / "alias.yaml"
    text = ("kind: Hypervisor\nmetadata:\n  name: a\n  annotations: {copy: &k secret}\nspec:\n  remoteCRIEndpoint:\n"
            "    clientCertificate:\n      privateKey: *k\n")
    alias.write_text(text)
    with pytest.raises(EditError, match="alias"):
        write_changes(encrypt_fields([("alias.yaml", alias)], [ident.recipient]))
    assert alias.read_text() == text


def test_encrypt_value_prints_an_armored_block_for_the_repo_recipients(remote, ident, tmp_path: Path):
    repo, _, _ = remote
    result = gitops("secrets", "encrypt-value", "--repo", str(repo), stdin="s3cret\n")
    assert result.exit_code == 0 and result.output.startswith("-----BEGIN AGE ENCRYPTED FILE-----")
    plain = subprocess.run(["age", "-d", "-i", str(ident.path)], input=result.output, capture_output=True,
                           text=True, check=True).stdout
    assert plain == "s3cret\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    result = gitops("secrets", "encrypt-value", "--repo", str(empty), stdin="x")
    assert result.exit_code == 1 and "no gitops.yaml found" in result.output


# --- validate, plan and apply ---------------------------------------------------------

def test_plaintext_private_key_is_refused_with_file_line_and_field(remote):
    repo, path, _ = remote
    write(repo, "inventory/secret.yaml", """
        apiVersion: v1
        kind: Secret
        metadata:
          name: stray
        stringData:
          id_rsa: |
            -----BEGIN OPENSSH PRIVATE KEY-----
            b3BlbnNzaC1rZXktdjEAAAAA
            -----END OPENSSH PRIVATE KEY-----
        """)
    found = [str(d) for d in validate_repo(repo).diagnostics]
    line = line_of(path, "privateKey:")
    assert f"hypervisors/remote.yaml:{line}: Hypervisor/remote-1: {KEY_FIELD}: plaintext private key in the repo; " \
           f"encrypt it: gitops secrets encrypt hypervisors/remote.yaml --field {KEY_FIELD}, or set " \
           "spec.secrets.allowPlaintext: true in gitops.yaml (labs only)" in found
    assert any(f.startswith("inventory/secret.yaml:6: Secret/stray: stringData.id_rsa: plaintext private key in "
                            "the repo; this field is not a secret field") for f in found)
    result = gitops("validate", str(repo))
    assert result.exit_code == 1 and "invalid: 2 error(s) in 2 file(s)" in result.output


def test_allow_plaintext_turns_the_refusal_into_a_warning(remote, ident):
    repo, path, _ = remote
    write(repo, "gitops.yaml", config([ident.recipient], allow_plaintext=True))
    validation = validate_repo(repo)
    assert validation.ok and validation.model is not None
    assert [str(w) for w in validation.warnings] == [
        f"hypervisors/remote.yaml:{line_of(path, 'privateKey:')}: Hypervisor/remote-1: {KEY_FIELD}: plaintext "
        "private key (allowed by spec.secrets.allowPlaintext in gitops.yaml)"]
    result = gitops("validate", str(repo))
    assert result.exit_code == 0 and "warning: hypervisors/remote.yaml" in result.output


def test_the_identity_decrypts_in_memory_and_the_model_holds_the_plaintext(remote, ident):
    repo, path, key = remote
    encrypt_repo(repo, ident.recipient)
    on_disk = path.read_text()
    validation = validate_repo(repo, ident.text)
    assert validation.ok, validation.diagnostics
    endpoint = validation.model.hypervisors["remote-1"].endpoint
    assert isinstance(endpoint, RemoteCRIEndpoint) and endpoint.client_private_key == key
    assert validation.decrypted == 1 and path.read_text() == on_disk
    # the CLI: --identity, or $GITOPS_IDENTITY
    assert gitops("validate", str(repo), "--identity", str(ident.path)).exit_code == 0
    result = gitops("validate", str(repo), env={"GITOPS_IDENTITY": str(ident.path)})
    assert result.exit_code == 0 and "not decrypted" not in result.output


def test_without_an_identity_validate_checks_the_armor_and_says_so(remote, ident):
    repo, path, _ = remote
    encrypt_repo(repo, ident.recipient)
    result = gitops("validate", str(repo), env={"GITOPS_IDENTITY": ""})
    assert result.exit_code == 0, result.output
    assert "note: 1 encrypted secret field(s) not decrypted (no --identity or $GITOPS_IDENTITY): their armor " \
           "was checked, not what they hold" in result.output
    assert "Traceback" not in result.output
    # plan and apply need the plaintext: a clear error naming the field, before anything is observed
    line = line_of(path, "privateKey:")
    for verb in ("plan", "apply"):
        result = gitops(verb, str(repo), "--state-dir", str(repo.parent / "state"), env={"GITOPS_IDENTITY": ""})
        assert result.exit_code == 1
        assert f"hypervisors/remote.yaml:{line}: Hypervisor/remote-1: {KEY_FIELD}: age-encrypted, and no identity " \
               "to decrypt it (--identity FILE or $GITOPS_IDENTITY)" in result.output


def test_a_value_that_does_not_decrypt_is_an_error_naming_the_field(remote, ident, tmp_path: Path):
    repo, path, _ = remote
    encrypt_repo(repo, ident.recipient)
    line = line_of(path, "privateKey:")
    where = f"hypervisors/remote.yaml:{line}: Hypervisor/remote-1: {KEY_FIELD}: "
    stranger = new_identity(tmp_path / "stranger.key")
    validation = validate_repo(repo, stranger.text)
    assert validation.model is None
    assert [str(d) for d in validation.diagnostics] == [
        where + "cannot decrypt (not encrypted to this identity, or corrupt): No matching keys found"]
    # corrupt armor: a body line cut short, then the END line lost
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    body = next(i for i, ln in enumerate(lines) if "BEGIN AGE" in ln) + 2
    path.write_text("".join(lines[:body] + [lines[body][:20] + "\n"] + lines[body + 1:]))
    for identity in (ident.text, None):
        found = [str(d) for d in validate_repo(repo, identity, sealed_ok=True).diagnostics]
        assert found == [where + "corrupt age armor: line 3 of the block has 12 characters (age writes 64 per line, "
                                 "the last one shorter)"]
    path.write_text(text.replace("        -----END AGE ENCRYPTED FILE-----\n", ""))
    found = [str(d) for d in validate_repo(repo, ident.text).diagnostics]
    assert found == [where + "corrupt age armor: the last line is not -----END AGE ENCRYPTED FILE----- (truncated?)"]
    result = gitops("validate", str(repo), "--identity", str(ident.path))
    assert result.exit_code == 1 and "Traceback" not in result.output


def test_an_encrypted_value_outside_the_secret_fields_is_an_error(remote, ident):
    repo, path, _ = remote
    encrypt_repo(repo, ident.recipient)
    armored = field_value(path)
    text = path.read_text().replace("criEndpointURI: tcp://127.0.30.9:7443",
                                    "criEndpointURI: |\n" + "".join(f"      {ln}\n" for ln in armored.splitlines()))
    path.write_text(text)
    found = [str(d) for d in validate_repo(repo, ident.text).diagnostics]
    assert any("spec.remoteCRIEndpoint.criEndpointURI: age-encrypted value in a field gitops does not decrypt "
               f"(secret fields: Hypervisor: {KEY_FIELD}; GitopsConfig: spec.backup.targets[*].password, "
               "spec.notifications.targets[*].url; SIPCluster: spec.services.auth.clients[*].secret)" in f
               for f in found), found


# --- rekey ------------------------------------------------------------------------------

def test_rekey_reencrypts_for_the_new_recipients(remote, ident, tmp_path: Path):
    repo, path, key = remote
    encrypt_repo(repo, ident.recipient)
    newcomer = new_identity(tmp_path / "newcomer.key")
    assert not validate_repo(repo, newcomer.text).ok
    write(repo, "gitops.yaml", config([ident.recipient, newcomer.recipient]))
    result = gitops("secrets", "rekey", str(repo), "--identity", str(ident.path))
    assert result.exit_code == 0, result.output
    assert "re-encrypted for 2 recipient(s)" in result.output and "1 file(s) rewritten in place" in result.output
    for who in (ident, newcomer):
        validation = validate_repo(repo, who.text)
        assert validation.ok and validation.model.hypervisors["remote-1"].endpoint.client_private_key == key
    # the controller leaves: rekey with the newcomer, and the old identity no longer decrypts
    write(repo, "gitops.yaml", config([newcomer.recipient]))
    write_changes(rekey_fields([("hypervisors/remote.yaml", path)], load_identities(newcomer.text),
                               [newcomer.recipient]))
    assert not validate_repo(repo, ident.text).ok and validate_repo(repo, newcomer.text).ok


def test_rekey_writes_nothing_unless_every_value_decrypts(remote, ident, tmp_path: Path):
    repo, path, _ = remote
    other = new_identity(tmp_path / "other.key")
    second = write(repo, "hypervisors/second.yaml", path.read_text().replace("remote-1", "remote-2")
                   .replace("127.0.30.9", "127.0.30.8"))
    write_changes(encrypt_fields([("hypervisors/remote.yaml", path)], [ident.recipient]))
    write_changes(encrypt_fields([("hypervisors/second.yaml", second)], [other.recipient]))
    before = (path.read_text(), second.read_text())
    result = gitops("secrets", "rekey", str(repo), "--identity", str(ident.path))
    assert result.exit_code == 1
    assert "nothing was re-encrypted" in result.output and "hypervisors/second.yaml:" in result.output
    assert (path.read_text(), second.read_text()) == before
    listing = gitops("secrets", "list", str(repo)).output
    assert f"hypervisors/remote.yaml:{line_of(path, 'privateKey:')}: Hypervisor/remote-1: {KEY_FIELD}: encrypted" \
           in listing


def test_find_fields_reports_plaintext_and_encrypted(remote, ident):
    repo, path, _ = remote
    [field] = find_fields("hypervisors/remote.yaml", path.read_text())
    assert not field.encrypted and field.line == line_of(path, "privateKey:")
    encrypt_repo(repo, ident.recipient)
    [field] = find_fields("hypervisors/remote.yaml", path.read_text())
    assert field.encrypted


# --- the controller ---------------------------------------------------------------------

def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=cwd,
                          check=True, capture_output=True, text=True, timeout=60).stdout


def test_the_controller_decrypts_with_its_identity_and_writes_no_key_anywhere(remote, ident, tmp_path: Path):
    """No lab: the hypervisor does not answer. A key the controller cannot decrypt refuses the commit
    with file, line and field; one it can is used, and neither the status branch, the workdir nor
    the logs hold it."""
    import sys
    repo, path, key = remote
    gitops_bin = str(Path(sys.executable).parent / "gitops")
    origin, workdir = tmp_path / "origin.git", tmp_path / "controller"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "remote", "add", "origin", str(origin))
    stranger = new_identity(tmp_path / "stranger.key")
    write_changes(encrypt_fields([("hypervisors/remote.yaml", path)], [stranger.recipient]))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "key for someone else")
    _git(repo, "push", "-q", "origin", "HEAD:main")

    def reconcile() -> subprocess.CompletedProcess:
        return subprocess.run([gitops_bin, "reconcile", "--repo", str(origin), "--workdir", str(workdir),
                               "--identity", str(ident.path), "--log-format", "text"],
                              capture_output=True, text=True, timeout=300)

    refused = reconcile()
    assert refused.returncode == 1 and refused.stdout.startswith("Refused: "), refused.stdout + refused.stderr
    source = yaml.safe_load(_git(origin, "show", "gitops/status:status/source.yaml"))["status"]
    line = line_of(path, "privateKey:")
    assert f"hypervisors/remote.yaml:{line}: Hypervisor/remote-1: {KEY_FIELD}: cannot decrypt" in source["errors"][0]

    write_changes(rekey_fields([("hypervisors/remote.yaml", path)], load_identities(stranger.text),
                               [ident.recipient]))
    _git(repo, "commit", "-qam", "rekeyed for the controller")
    _git(repo, "push", "-q", "origin", "HEAD:main")
    done = reconcile()
    source = yaml.safe_load(_git(origin, "show", "gitops/status:status/source.yaml"))["status"]
    assert source["result"] != "Refused", source
    body = key.splitlines()[1]
    logs = refused.stdout + refused.stderr + done.stdout + done.stderr
    files = _git(origin, "ls-tree", "-r", "--name-only", "gitops/status").split()
    status = "".join(_git(origin, "show", f"gitops/status:{f}") for f in files)
    # (the controller's own status signing key is the one private key its workdir holds, by design: mode 0600)
    signing = workdir / "status-signing-key"
    assert signing.is_file() and signing.stat().st_mode & 0o077 == 0
    local = "".join(p.read_bytes().decode("utf-8", "replace") for p in workdir.rglob("*")
                    if p.is_file() and ".git" not in p.parts and p != signing)
    for where, text in (("logs", logs), ("status branch", status), ("workdir", local)):
        assert "PRIVATE KEY" not in text and body not in text, where


# --- the lab's example repo (no lab started: the lab's description is made up) -------------

def _fake_lab(tmp_path: Path, kinds: tuple[bool, ...] = (True, True, False, False)):
    from gitops.lab.lab import LabHypervisor, LabInfo
    from gitops.model.resources import PortRange

    ca, ca_key = make_cert("lab ca", ca=True)
    client, client_key = make_cert("gitops", issuer_key=ca_key, issuer=ca)
    hvs = []
    second_private = [n for n, public in enumerate(kinds, start=1) if not public][1:2]
    for n, public in enumerate(kinds, start=1):
        remote = f"tcp://127.0.99.{n}:10250" if [n] == second_private else ""  # hv-private-2's, behind mTLS
        hvs.append(LabHypervisor(f"hv-{n}", public, f"127.0.99.{n}", PortRange(30000 + 1000 * n, 30999 + 1000 * n),
                                 str(tmp_path / f"hv-{n}"), str(tmp_path / f"hv-{n}.sock"), remote,
                                 ca_pem=pem_cert(ca), client_cert_pem=pem_cert(client),
                                 client_key_pem=pem_key(client_key) if remote else ""))
    return LabInfo(tmp_path, tuple(hvs), {}, ()), pem_key(client_key)


def test_lab_example_repo_takes_every_machine_of_the_lab(tmp_path: Path):
    """A lab larger than the example (3 private and 3 public): the machines left over join the fleet as
    hv-private-3 and hv-public-3, so the example clusters' members spread over 3 machines."""
    from gitops.lab.example import write_example_repo

    lab, _key = _fake_lab(tmp_path, (True, True, True, False, False, False))
    mapping = write_example_repo(lab, tmp_path / "repo")
    validation = validate_repo(tmp_path / "repo")
    assert validation.ok, validation.diagnostics
    hvs = validation.model.hypervisors
    assert sorted(hvs) == ["hv-private-1", "hv-private-2", "hv-private-3", "hv-public-1", "hv-public-2",
                           "hv-public-3"]
    assert [hvs[n].public for n in sorted(hvs)] == [False, False, False, True, True, True]
    assert mapping[-2:] == [f"hv-public-3 -> hv-3 ({lab.hypervisors[2].socket})",
                            f"hv-private-3 -> hv-6 ({lab.hypervisors[5].socket})"]
    assert len({hv.ip_address for hv in hvs.values()}) == 6


def test_lab_example_repo_gives_each_cluster_the_examples_two_ingress_nodes_or_as_many_as_asked(tmp_path: Path):
    """The example's clusters have two ingress nodes each (a virtual IP of the lab's pool); a lab with one
    public machine takes `ingress_nodes=1`: the second ingress nodes and hv-public-2 are left out. More
    ingress nodes than public machines is refused before anything is written."""
    from gitops.lab.example import write_example_repo

    lab, _key = _fake_lab(tmp_path)
    write_example_repo(lab, tmp_path / "two")
    two = validate_repo(tmp_path / "two")
    assert two.ok, two.diagnostics
    ingress = sorted(n.name for n in two.model.nodes.values() if n.role == "controlplane-ingress")
    assert ingress == ["team-a-ingress", "team-a-ingress-2", "team-b-ingress", "team-b-ingress-2"]
    assert "virtualIPs: [127.0.10.200-127.0.10.219]" in (tmp_path / "two" / "gitops.yaml").read_text()

    one_public, _ = _fake_lab(tmp_path / "small", (True, False, False))
    with pytest.raises(LabError, match="2 ingress nodes per cluster sit on distinct public machines and the lab "
                                       "has 1 .*--ingress-nodes 1"):
        write_example_repo(one_public, tmp_path / "refused")
    assert not (tmp_path / "refused").exists() or not any((tmp_path / "refused").rglob("*.yaml"))
    mapping = write_example_repo(one_public, tmp_path / "one", ingress_nodes=1)
    one = validate_repo(tmp_path / "one")
    assert one.ok, one.diagnostics
    assert sorted(n.name for n in one.model.nodes.values() if n.role == "controlplane-ingress") == \
        ["team-a-ingress", "team-b-ingress"]
    assert sorted(one.model.hypervisors) == ["hv-private-1", "hv-private-2", "hv-public-1"]
    assert "hv-public-2: left out (no lab machine for it, and no Node pinned to it)" in mapping
    text = (tmp_path / "one" / "clusters" / "team-a" / "nodes.yaml").read_text()
    assert text.startswith("# yaml-language-server") and "team-a-ingress-2" not in text

    write_example_repo(lab, tmp_path / "three", ingress_nodes=2)
    assert (tmp_path / "three" / "clusters" / "team-a" / "nodes.yaml").read_text() == \
        (tmp_path / "two" / "clusters" / "team-a" / "nodes.yaml").read_text()


def test_lab_example_repo_keeps_plaintext_keys_allowed_by_default(tmp_path: Path):
    from gitops.lab.example import write_example_repo

    lab, key = _fake_lab(tmp_path)
    write_example_repo(lab, tmp_path / "repo")
    validation = validate_repo(tmp_path / "repo")
    assert validation.ok, validation.diagnostics
    assert [w.file for w in validation.warnings] == ["hypervisors/hv-private-2.yaml"]
    assert validation.model.hypervisors["hv-private-2"].endpoint.client_private_key == key


def test_lab_example_repo_encrypts_its_client_key_for_the_given_recipient(tmp_path: Path, ident):
    from gitops.lab.example import example_source, write_example_repo

    lab, key = _fake_lab(tmp_path)
    repo = tmp_path / "repo"
    result = gitops("secrets", "list", str(example_source()))
    assert "PLAINTEXT" in result.output  # the shipped example: a throwaway key, allowed
    write_example_repo(lab, repo, recipients=[ident.recipient])
    assert "PRIVATE KEY" not in "".join(p.read_text() for p in repo.rglob("*.yaml"))
    validation = validate_repo(repo, ident.text)
    assert validation.ok and not validation.warnings, validation.diagnostics + validation.warnings
    assert validation.model.hypervisors["hv-private-2"].endpoint.client_private_key == key
    assert not validate_repo(repo).ok  # plan and apply need the identity now
    config_before = (example_source() / "gitops.yaml").read_text().splitlines()
    config_after = (repo / "gitops.yaml").read_text().splitlines()
    changed = [(a, b) for a, b in zip(config_before, config_after) if a != b]
    assert len(config_before) == len(config_after) and [b.strip() for _, b in changed] == [
        f"- {ident.recipient}  # set by gitops lab example-repo --encrypt-to", "allowPlaintext: false"]
