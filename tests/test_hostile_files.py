"""Hostile files (issue #27): special files, symlinks, huge files, broken state and plan files.

Every case runs the `gitops` command and asserts its exit code, its message, no traceback, a
time bound (a FIFO must not make it wait) and a peak-RSS bound (a 1 GiB file must not be read).
"""
from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import pytest
from hostile import HYPERVISOR, Case, assert_table, config_yaml, repo_with

from gitops.errors import GitopsError
from gitops.plan.saved import SavedPlan
from gitops.safeio import FileRefused, read_bytes
from gitops.state import LocalDirStore
from gitops.state.records import State

GiB = 1024 ** 3
VALID = {"hv.yaml": HYPERVISOR.format(name="hv-1", ip="10.0.0.1")}
PATHS = config_yaml("  paths: [inventory]\n")


def fifo(rel: str, command: str = "validate"):
    def setup(tmp: Path) -> list[str]:
        repo = repo_with(tmp, VALID)
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(repo / rel)
        return [command, "list", "repo"] if command == "secrets" else [command, "repo"]
    return setup


def link(rel: str, target: str | None, files: dict[str, str] | None = None, command: str = "validate"):
    """repo/REL -> TARGET (None: REL links to itself, a loop)."""
    def setup(tmp: Path) -> list[str]:
        repo = repo_with(tmp, {**VALID, **(files or {})})
        (tmp / "outside.yaml").write_text(config_yaml("  paths: [nowhere]\n  statusBranch: SECRET-OUTSIDE-VALUE\n"))
        (repo / rel).symlink_to(target if target is not None else rel)
        return [command, "list", "repo"] if command == "secrets" else [command, "repo"]
    return setup


def sparse(rel: str, size: int, command: str = "validate"):
    def setup(tmp: Path) -> list[str]:
        repo = repo_with(tmp, VALID)
        with open(repo / rel, "wb") as handle:
            handle.truncate(size)
        return [command, "list", "repo"] if command == "secrets" else [command, "repo"]
    return setup


def config_dir(tmp: Path) -> list[str]:
    repo = repo_with(tmp, VALID)
    (repo / "gitops.yaml").mkdir()
    return ["validate", "repo"]


def config_fifo(tmp: Path) -> list[str]:
    repo = repo_with(tmp, VALID)
    os.mkfifo(repo / "gitops.yaml")
    return ["validate", "repo"]


def socket_file(tmp: Path) -> list[str]:
    repo = repo_with(tmp, VALID)
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(repo / "s.yaml"))
    finally:
        sock.close()
    return ["validate", "repo"]


NOT_READ = "refusing to read it"

SPECIAL = [
    # HIGH: nothing waits on a FIFO; a device is never read
    Case("fifo-yaml-validate", fifo("x.yaml"), 1, ("x.yaml:1: is a FIFO (named pipe), not a regular file",)),
    Case("fifo-yaml-secrets-list", fifo("x.yaml", "secrets"), 1, ("x.yaml: is a FIFO (named pipe)",)),
    Case("fifo-yaml-nested-dir", fifo("deep/er/x.yml"), 1, ("deep/er/x.yml:1: is a FIFO",)),
    Case("socket-yaml", socket_file, 1, ("s.yaml:1: is a socket, not a regular file",)),
    Case("char-device-behind-a-name", link("zero.yaml", "/dev/zero"), 1,
         ("zero.yaml:1: symlink points outside the repo; refusing to read it",)),
]

SYMLINKS = [
    Case("symlink-loop-self", link("a.yaml", None), 1, ("a.yaml:1: symlink loop",)),
    Case("symlink-loop-pair", lambda tmp: (link("b.yaml", "c.yaml")(tmp), (tmp / "repo/c.yaml").symlink_to("b.yaml"),
                                           ["validate", "repo"])[-1], 1, ("b.yaml:1: symlink loop", "c.yaml:1: symlink loop")),
    Case("symlink-dangling", link("d.yaml", "missing.yaml"), 1, ("d.yaml:1: dangling symlink",)),
    Case("symlink-outside", link("o.yaml", "../outside.yaml"), 1, ("o.yaml:1: symlink points outside the repo",),
         never=("SECRET-OUTSIDE-VALUE",)),
    Case("symlink-outside-secrets-list", link("o.yaml", "../outside.yaml", command="secrets"), 1,
         ("o.yaml:1: symlink points outside the repo",), never=("SECRET-OUTSIDE-VALUE",)),
]

CONFIG = [
    # HIGH: gitops.yaml that cannot be read is an error, never the defaults (which would read the whole tree)
    Case("config-symlink-outside", link("gitops.yaml", "../outside.yaml"), 1,
         ("gitops.yaml:1: symlink points outside the repo",), never=("SECRET-OUTSIDE-VALUE", "hv.yaml")),
    Case("config-dangling", link("gitops.yaml", "nowhere.yaml"), 1, ("gitops.yaml:1: dangling symlink",),
         never=("ok:", "hv.yaml")),
    Case("config-directory", config_dir, 1, ("gitops.yaml:1: is a directory, not a regular file",), never=("ok:",)),
    Case("config-loop", link("gitops.yaml", None), 1, ("gitops.yaml:1: symlink loop",), never=("ok:",)),
    Case("config-fifo", config_fifo, 1, ("gitops.yaml:1: is a FIFO (named pipe)",), never=("ok:",)),
    Case("config-to-device", link("gitops.yaml", "/dev/zero"), 1, ("gitops.yaml:1: symlink points outside",)),
]

SIZES = [
    # MEDIUM: size limits hold before reading: a sparse file is never read
    Case("sparse-1gib-validate", sparse("big.yaml", GiB), 1, ("big.yaml:1: file is larger than 8 MiB",),
         max_rss_mib=100),
    Case("sparse-1gib-secrets-list", sparse("big.yaml", GiB, "secrets"), 1, ("big.yaml: file is larger than 8 MiB",),
         max_rss_mib=100),
    Case("sparse-3gib-validate", sparse("big.yaml", 3 * GiB), 1, ("big.yaml:1: file is larger than 8 MiB",),
         max_rss_mib=100),
    Case("sparse-1gib-config", sparse("gitops.yaml", GiB), 1, ("gitops.yaml:1: file is larger than 8 MiB",),
         max_rss_mib=100, never=("hv.yaml",)),
]


def test_special_files_are_refused_without_waiting(tmp_path: Path) -> None:
    assert_table(SPECIAL, tmp_path)


def test_symlink_loops_dangling_and_outside_links_are_refused(tmp_path: Path) -> None:
    assert_table(SYMLINKS, tmp_path)


def test_a_directory_swapped_for_a_link_after_the_listing_is_refused(tmp_path: Path) -> None:
    """The repo is listed without following links, then its files are read without resolving them again:
    a directory replaced by a link out of the repo in between is caught by where the opened file lies."""
    from gitops.model.repo import _walk_yaml
    from gitops.model.config import RepoConfig

    root, outside = tmp_path / "repo", tmp_path / "outside"
    (root / "inventory").mkdir(parents=True)
    (root / "inventory" / "a.yaml").write_text("kind: Hypervisor\n")
    (outside / "inventory").mkdir(parents=True)
    (outside / "inventory" / "a.yaml").write_text("secret: from outside\n")
    listed = _walk_yaml(root, RepoConfig(paths=("inventory",)), None, [])
    assert listed == {"inventory/a.yaml": False}
    assert read_bytes(f"{root}/inventory/a.yaml", 1024, inside=root, resolved=True) == b"kind: Hypervisor\n"
    (root / "inventory").rename(tmp_path / "moved")
    (root / "inventory").symlink_to(outside / "inventory")
    with pytest.raises(FileRefused, match="symlink points outside the repo"):
        read_bytes(f"{root}/inventory/a.yaml", 1024, inside=root, resolved=True)


def test_unreadable_gitops_yaml_is_an_error_not_the_defaults(tmp_path: Path) -> None:
    assert_table(CONFIG, tmp_path)


def test_size_limits_hold_before_reading(tmp_path: Path) -> None:
    assert_table(SIZES, tmp_path)


def test_past_the_file_limit_the_rest_is_not_read_and_the_repo_refused(tmp_path: Path, monkeypatch) -> None:
    from gitops.model import repo as repo_module
    from gitops.model.validate import validate_repo

    monkeypatch.setattr(repo_module, "MAX_FILES", 3)
    files = {f"hv-{i}.yaml": HYPERVISOR.format(name=f"hv-{i}", ip=f"127.0.40.{i + 1}", low=30000 + 10 * i,
                                               high=30009 + 10 * i) for i in range(5)}
    repo = repo_with(tmp_path, files, config=config_yaml("  paths: [.]\n"))
    result = validate_repo(repo)
    assert result.model is None
    assert [str(d) for d in result.diagnostics] == [
        "hv-3.yaml:1: the repo has more than 3 YAML files under spec.paths; this one and the rest are not read"]


# --- the state directory, saved plans, identities, schema --write --------------------

def empty_repo(tmp: Path) -> Path:
    return repo_with(tmp, {}, config=PATHS.replace("[inventory]", "[.]"))


def state(content: str | bytes | None = None, *, special: str = "", command: str = "plan"):
    def setup(tmp: Path) -> list[str]:
        empty_repo(tmp)
        state_dir = tmp / "state"
        state_dir.mkdir()
        if special == "fifo":
            os.mkfifo(state_dir / "state.json")
        elif special == "device":
            (state_dir / "state.json").symlink_to("/dev/zero")
        elif special == "directory":
            (state_dir / "state.json").mkdir()
        elif special == "sparse":
            with open(state_dir / "state.json", "wb") as handle:
                handle.truncate(GiB)
        elif isinstance(content, bytes):
            (state_dir / "state.json").write_bytes(content)
        else:
            (state_dir / "state.json").write_text(content or "")
        return [command, "repo", "--state-dir", str(state_dir)]
    return setup


def state_dir_under_a_file(tmp: Path) -> list[str]:
    empty_repo(tmp)
    (tmp / "plain").write_text("x")
    return ["plan", "repo", "--state-dir", str(tmp / "plain" / "state")]


def read_only_state_dir(command: str):
    def setup(tmp: Path) -> list[str]:
        empty_repo(tmp)
        if os.geteuid() == 0:
            directory = Path("/sys")  # root writes anywhere but on a filesystem that creates no files
        else:
            directory = tmp / "ro"
            directory.mkdir()
            directory.chmod(0o500)
        return [command, "repo", "--state-dir", str(directory)]
    return setup


def plan_file(content: str | None = None, *, special: str = ""):
    def setup(tmp: Path) -> list[str]:
        empty_repo(tmp)
        path = tmp / "plan.json"
        if special == "fifo":
            os.mkfifo(path)
        elif special == "sparse":
            with open(path, "wb") as handle:
                handle.truncate(GiB)
        elif special != "device":
            path.write_text(content or "")
        target = "/dev/zero" if special == "device" else str(path)
        return ["apply", target, "--repo", "repo", "--state-dir", str(tmp / "state")]
    return setup


def identity(special: str):
    def setup(tmp: Path) -> list[str]:
        empty_repo(tmp)
        path = tmp / "key.txt"
        if special == "fifo":
            os.mkfifo(path)
        else:
            with open(path, "wb") as handle:
                handle.truncate(GiB)
        return ["validate", "repo", "--identity", str(path)]
    return setup


def schema_under_a_file(tmp: Path) -> list[str]:
    (tmp / "plain").write_text("x")
    return ["schema", "--write", str(tmp / "plain" / "schemas")]


NESTED = "[" * 100_000 + "]" * 100_000
NODE = {"cluster": "c", "hypervisor": "h"}
STATE = [
    # HIGH: a FIFO as state.json does not hang plan
    Case("state-fifo", state(special="fifo"), 1, ("state.json: is a FIFO (named pipe)", "cannot read state")),
    Case("state-char-device", state(special="device"), 1, ("state.json: is a character device",)),
    Case("state-sparse-1gib", state(special="sparse"), 1, ("state.json: file is larger than 256 MiB",),
         max_rss_mib=100),
    # MEDIUM: corrupt state is one line, naming the field
    Case("state-json-array", state("[]"), 1, ("corrupt state file (at the top level: [] is not of type 'object')",)),
    Case("state-wrong-type", state(json.dumps({"nodes": {"n1": {**NODE, "cluster": 5}}})), 1,
         ("corrupt state file (at nodes.n1.cluster: 5 is not of type 'string')",)),
    Case("state-dir-under-a-file", state_dir_under_a_file, 1, ("cannot use as the state directory: Not a directory",)),
    Case("state-dir-read-only-plan", read_only_state_dir("plan"), 0, ("No changes",)),
    Case("state-dir-read-only-apply", read_only_state_dir("apply"), 1, ("cannot save state: Permission denied",)),
]

PLANS = [
    # saved plans: the same reader
    Case("plan-file-fifo", plan_file(special="fifo"), 1, ("plan.json: is a FIFO (named pipe)",)),
    Case("plan-file-char-device", plan_file(special="device"), 1, ("/dev/zero: is a character device",)),
    Case("plan-file-sparse", plan_file(special="sparse"), 1, ("plan.json: file is larger than 512 MiB",),
         max_rss_mib=100),
    Case("plan-file-wrong-types", plan_file(json.dumps({"format": "gitops.infra/saved-plan", "version": 1,
                                                        "digests": [], "plan": 5, "plannedState": []})), 1,
         ("corrupt saved plan",)),
]

OTHER = [
    # identities
    Case("identity-fifo", identity("fifo"), 1, ("cannot read the age identity", "key.txt: is a FIFO")),
    Case("identity-sparse", identity("sparse"), 1, ("key.txt: file is larger than 1 MiB",), max_rss_mib=100),
    # MEDIUM: schema --write under a file
    Case("schema-write-under-a-file", schema_under_a_file, 1, ("error: cannot write", "Not a directory")),
]


def test_broken_state_is_one_line(tmp_path: Path) -> None:
    assert_table(STATE, tmp_path)


def test_broken_saved_plan_is_one_line(tmp_path: Path) -> None:
    assert_table(PLANS, tmp_path)


def test_identity_files_and_schema_write(tmp_path: Path) -> None:
    assert_table(OTHER, tmp_path)


# --- in process: the shapes a state file may not have, the reader itself ---------------

@pytest.mark.parametrize("data, where", [
    ({"nodes": {"n1": {**NODE, "ports": ["x"]}}}, "at nodes.n1.ports: ['x'] is not of type 'object'"),
    ({"nodes": {"n1": {"cluster": "c"}}}, "at nodes.n1: 'hypervisor' is a required property"),
    ({"clusters": {"c": {"authorities": {"cluster": "pem"}}}}, "at clusters.c.authorities.cluster: 'pem' is not of type"),
    ({"clusters": {"c": {"rotation": {"generation": 2, "phase": "x"}}}}, "at clusters.c.rotation.phase: 'x' is not one"),
    ({"clusters": {"c": {"etcd_members": "abc"}}}, "at clusters.c.etcd_members: 'abc' is not of type 'array'"),
    ({"sip_labels": {"h": {"k": 5}}}, "at sip_labels.h.k: 5 is not of type"),
    ({"clusters": []}, "at clusters: [] is not of type 'object'"),
])
def test_state_of_the_wrong_shape_names_the_field(data, where):
    with pytest.raises(ValueError) as err:
        State.parse(data)
    assert str(err.value).startswith(where), str(err.value)


@pytest.mark.parametrize("make, says", [
    (lambda d: (d / "state.json").mkdir(), "state.json: is a directory"),
    (lambda d: (d / "state.json").write_bytes(b'{"nodes": "\xff"}'), "state.json: not UTF-8 text (line 1)"),
    (lambda d: (d / "state.json").write_text(NESTED), "corrupt state file"),
    (lambda d: (d / "state.json").write_text("{"), "corrupt state file"),
])
def test_unreadable_state_is_one_clear_error(tmp_path, make, says):
    make(tmp_path)
    with pytest.raises(GitopsError) as err:
        LocalDirStore(tmp_path).load()
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("text, says", [
    ("[]", "not a saved plan"),
    (NESTED, "not a saved plan (not JSON"),
    (json.dumps({"format": "gitops.infra/saved-plan", "version": 1, "digests": {}, "plan": {}, "plannedState": []}),
     "corrupt saved plan"),
])
def test_corrupt_saved_plan_is_one_clear_error(text, says):
    with pytest.raises(GitopsError, match=re.escape(says)):
        SavedPlan.from_json(text, "plan.json")


def test_a_recorded_state_still_loads():
    state = State.parse({"version": 1, "nodes": {"n1": {**NODE, "ports": {"etcd-client": 31000}}},
                             "clusters": {"c": {"authorities": {"cluster": {"cert_pem": "C", "key_pem": "K"}},
                                                "admin": None, "etcd_members": ["n1"], "ca_generation": 1,
                                                "rotation": None}}, "sip_labels": {"ns/h": {"k": None}}})
    assert State.parse(state.to_dict()) == state



def test_reader_stops_at_the_limit_when_the_size_lies():
    """/proc files report size 0: the limit holds while reading, not only from fstat."""
    with pytest.raises(FileRefused, match="larger than 64 bytes"):
        read_bytes("/proc/self/maps", 64)
    assert len(read_bytes("/proc/self/maps", 64 * 1024 * 1024)) > 64


def test_reader_refuses_a_link_out_of_inside(tmp_path):
    (tmp_path / "inner").mkdir()
    (tmp_path / "secret").write_text("x")
    (tmp_path / "inner" / "l").symlink_to("../secret")
    with pytest.raises(FileRefused, match="outside the repo"):
        read_bytes(tmp_path / "inner" / "l", 10, inside=tmp_path / "inner")
    assert read_bytes(tmp_path / "inner" / "l", 10) == b"x"
