"""Onboarding a machine as a Hypervisor (issue #43.1): `gitops hypervisor init` on the machine, `gitops hypervisor
add` where gitops runs, on real parts.

The machine is a fresh network namespace on a lab's bridge (as a new box on the network) with nothing of gitops
on it: `init` runs there (`nsenter --net`), writes containerd's config, starts Debian's containerd through its
`--restart` command, makes the front's key there and waits; `add` pins it by its fingerprint, signs it with the
fleet's hypervisor CA from the recorded state, hands it its certificate, and writes `hypervisors/NAME.yaml` with
the client key age-encrypted; the machine then runs its real haproxy front, and the CRI answers over mutual TLS.
Bad input gets a clear error and changes nothing.
"""
from __future__ import annotations

import json
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import running_lab
from repo_helpers import write

from gitops.lab import kubebin, network
from gitops.model import versions

pytestmark = pytest.mark.lab("onboarding")

GITOPS = str(Path(sys.executable).parent / "gitops")
SUBNET = "127.0.44"


class Box:
    """A new machine on the lab network, and the fleet's repo and state beside it."""

    def __init__(self, base: Path, lab, machine: network.Machine):  # type: ignore[no-untyped-def]
        self.base, self.lab, self.machine = base, lab, machine
        self.dir = base / "machine"  # the machine's own disk: its containerd and the front's files
        self.repo, self.state, self.identity = base / "repo", base / "state", base / "controller.key"

    def gitops(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([GITOPS, *args], capture_output=True, text=True, timeout=120)
        assert "Traceback" not in proc.stderr, proc.stderr
        if check:
            assert proc.returncode == 0, proc.stderr
        return proc

    def init_argv(self, ca_hash: str, address: str | None = None) -> list[str]:
        config = self.dir / "containerd.toml"
        binary = kubebin.containerd_program("containerd")  # the new machine's containerd: 2.x, built from its module
        start = f"sh -c '{binary} --config {config} >> {self.dir}/containerd.log 2>&1 &'"
        return network.enter(self.machine.netns, [
            GITOPS, "hypervisor", "init", "--address", address or self.machine.ip, "--ca-hash", ca_hash,
            "--dir", str(self.dir / "front"), "--containerd-binary", str(binary), "--containerd-config", str(config),
            "--containerd-root",
            str(self.dir / "containerd"), "--restart", start, "--data-dir", str(self.dir / "data"),
            "--sandbox-image", self.lab.images["pause"], "--timeout", "120", "--port-range", "31000-31999",
            "--sysctl-file", str(self.dir / "sysctl.conf")])

    def start_init(self, ca_hash: str) -> tuple[subprocess.Popen, str]:
        """`init` running on the machine, and the fingerprint it printed."""
        proc = subprocess.Popen(self.init_argv(ca_hash), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("this machine's key: "):
                # the release its --version names, and the config version that release reads without migrating
                assert f"found containerd {versions.CONTAINERD} (config version 4)\n" in seen, seen
                return proc, line.split(": ", 1)[1].strip()
        raise AssertionError("init printed no fingerprint:\n" + "".join(seen))

    def add(self, fingerprint: str, *extra: str, check: bool = True, name: str = "hv-new",
            address: str | None = None) -> subprocess.CompletedProcess:
        return self.gitops("hypervisor", "add", str(self.repo), "--state-dir", str(self.state), "--name", name,
                           "--address", address or self.machine.ip, "--fingerprint", fingerprint,
                           "--port-range", "31000-31999", *extra, check=check)


@pytest.fixture(scope="module")
def box():
    machine = network.LabNetwork(SUBNET).hypervisor(9, "new-machine")
    with running_lab("gitops-onboard-", hypervisors=1, public=1, subnet=SUBNET, kubernetes_versions=()) as (base, lab):
        try:
            network.create_machine(machine)
            b = Box(base, lab, machine)
            subprocess.run(["age-keygen", "-o", str(b.identity)], check=True, capture_output=True)
            recipient = subprocess.run(["age-keygen", "-y", str(b.identity)], check=True, capture_output=True,
                                       text=True).stdout.strip()
            write(b.repo, "gitops.yaml", f"""
                apiVersion: gitops.infra/v1alpha1
                kind: GitopsConfig
                spec:
                  secrets:
                    recipients: [{recipient}]
                """)
            hv = lab.hypervisors[0]
            write(b.repo, "hypervisors/hv-1.yaml", f"""
                apiVersion: gitops.infra/v1alpha1
                kind: Hypervisor
                metadata:
                  name: hv-1
                spec:
                  public: true
                  ipAddress: {hv.ip}
                  portRange: {{low: 30000, high: 30999}}
                  localCRIEndpoint:
                    criEndpointPath: {hv.socket}
                """)
            yield b
        finally:
            try:
                network.remove_machine(machine)  # its haproxy front and containerd with it
            finally:  # (its mounts, before the lab's temp dir is removed)
                subprocess.run(["umount", "-R", "-l", str(base / "machine")], capture_output=True)


def _repo_files(box: Box) -> dict[str, str]:
    return {str(p.relative_to(box.repo)): p.read_text() for p in sorted(box.repo.rglob("*")) if p.is_file()}


def test_a_machine_becomes_a_hypervisor_with_one_command_on_it_and_one_where_gitops_runs(box: Box) -> None:
    from gitops.cri.client import CRIClient
    from gitops.model.validate import load_hypervisors

    ca_hash = box.gitops("hypervisor", "ca-hash", str(box.repo), "--state-dir", str(box.state)).stdout.strip()
    assert ca_hash.startswith("sha256:") and len(ca_hash) == 71
    state = json.loads((box.state / "state.json").read_text())
    assert state["hypervisor_ca"]["key_pem"].startswith("-----BEGIN")  # in the recorded state, sealed like the others
    assert box.gitops("hypervisor", "ca-hash", str(box.repo), "--state-dir", str(box.state)).stdout.strip() == ca_hash

    # --- bad input on the machine: a clear error, nothing changed
    wrong_address = subprocess.run(box.init_argv(ca_hash, address="10.249.44.200"), capture_output=True, text=True)
    assert wrong_address.returncode == 1 and "--address 10.249.44.200 is not an address of this machine" in \
        wrong_address.stderr, wrong_address.stderr
    bad_hash = subprocess.run(box.init_argv("sha256:abc"), capture_output=True, text=True)
    assert bad_hash.returncode == 1 and "--ca-hash must be sha256: and 64" in bad_hash.stderr
    assert not box.dir.exists()

    # --- a machine told another CA's hash refuses the fleet's certificate; nothing is written on either side
    other = "sha256:" + "0" * 64
    proc, fingerprint = box.start_init(other)
    try:
        before_repo, before_state = _repo_files(box), (box.state / "state.json").read_text()
        refused = box.add(fingerprint, check=False)
        assert refused.returncode == 1, refused.stderr
        assert f"refused the certificate: the fleet's CA is {ca_hash}, not {other}" in refused.stderr, refused.stderr
        assert _repo_files(box) == before_repo and (box.state / "state.json").read_text() == before_state
        assert not (box.dir / "front" / "hypervisor.json").exists()
    finally:
        proc.kill()
        proc.wait()

    proc, again = box.start_init(ca_hash)
    try:
        assert again == fingerprint  # the key made there is kept for the next try: the same fingerprint
        key = box.dir / "front" / "server.key"
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        before = _repo_files(box)
        # --- bad input where gitops runs: refused before the machine is asked
        for extra, name, address, message in (
                ((), "hv-1", None, "a Hypervisor named hv-1 is already in the repo"),
                ((), "hv-new", box.lab.hypervisors[0].ip, f"address {box.lab.hypervisors[0].ip} is Hypervisor hv-1's"),
                (("--port-range", "30500-31500"), "hv-new", None, "overlaps Hypervisor hv-1's 30000-30999"),
                (("--port-range", "10000-10999"), "hv-new", None, "holds the CRI front's port 10250"),
                (("--port-range", "31000-32999"), "hv-new", None,
                 "--port-range 31000-32999 is not inside the ports the machine reserved for gitops's pods "
                 "(31000-31999"),
                (("--name", "HV_New"), "hv-new", None, "a Hypervisor's name is a DNS label")):
            bad = box.add(fingerprint, *extra, check=False, name=name, address=address)
            assert bad.returncode in (1, 2) and message in bad.stderr, (message, bad.stderr)
        wrong = box.add("sha256:" + "1" * 64, check=False)
        assert wrong.returncode == 1 and f"presents key {fingerprint}, not sha256:111" in wrong.stderr, wrong.stderr
        assert _repo_files(box) == before

        # --- the file a killed `add` for this machine key left (it writes the file before the delivery) is
        # unfinished work, not a reused name: the run below takes it over
        unfinished = box.repo / "hypervisors" / "hv-new.yaml"
        unfinished.write_text(f"# hv-new: onboarded with `gitops hypervisor add` (machine key {fingerprint});\n"
                              + (box.repo / "hypervisors" / "hv-1.yaml").read_text()
                              .replace("name: hv-1", "name: hv-new").replace(box.lab.hypervisors[0].ip, box.machine.ip)
                              .replace("low: 30000, high: 30999", "low: 31000, high: 31999"))
        silent = socket.create_connection((box.machine.ip, 10250))  # a peer that never speaks holds nothing up
        try:
            added = box.add(fingerprint, "--public", "--label", "topology.gitops.infra/zone=edge")
        finally:
            silent.close()
        path = Path(added.stdout.strip())
        assert path == box.repo / "hypervisors" / "hv-new.yaml"
        doc = yaml.safe_load(path.read_text())
        spec = doc["spec"]
        assert spec["ipAddress"] == box.machine.ip and spec["public"] is True
        assert spec["interface"] == "eth0"  # where a virtual IP it holds goes, as `init` found it
        assert spec["portRange"] == {"low": 31000, "high": 31999}
        assert doc["metadata"]["labels"] == {"topology.gitops.infra/zone": "edge"}
        endpoint = spec["remoteCRIEndpoint"]
        assert endpoint["criEndpointURI"] == f"tcp://{box.machine.ip}:10250"
        assert endpoint["clientCertificate"]["privateKey"].startswith("-----BEGIN AGE ENCRYPTED FILE-----")
        assert "PRIVATE KEY" not in path.read_text() and key.read_text() not in path.read_text()
        # the machine's front is up: the repo's endpoint (key decrypted with the controller's identity) answers
        hvs = load_hypervisors(box.repo, box.identity.read_text())
        with CRIClient(hvs["hv-new"].cri_endpoint(), timeout=5) as client:
            assert client.version().runtime_name == "containerd"
        assert box.gitops("validate", str(box.repo), "--identity", str(box.identity)).returncode == 0
        # --- the same `add` again (as after a kill between the delivery and its check): the front answers a
        # client certificate of the fleet's CA, the file is kept as it is
        written = path.read_text()
        rerun = box.add(fingerprint, "--public", "--label", "topology.gitops.infra/zone=edge")
        assert "was onboarded by an earlier run" in rerun.stderr and path.read_text() == written, rerun.stderr
        time.sleep(0.5)
        assert proc.poll() is None  # `init` became the front (haproxy in the foreground)
        assert Path(f"/proc/{proc.pid}/exe").resolve().name == "haproxy"
        record = json.loads((box.dir / "front" / "hypervisor.json").read_text())
        assert record["keyHash"] == fingerprint and record["caHash"] == ca_hash
        # the pods' ports (and the front's) are out of the machine's ephemeral ports, now and after a boot
        reserved = subprocess.run(network.enter(box.machine.netns, ["cat", "/proc/sys/net/ipv4/ip_local_reserved_ports"]),
                                  capture_output=True, text=True, check=True).stdout.strip()
        assert reserved == "10250,31000-31999", reserved
        assert (box.dir / "sysctl.conf").read_text() == f"net.ipv4.ip_local_reserved_ports = {reserved}\n"
        config = (box.dir / "containerd.toml").read_text()
        assert "restrict_oom_score_adj = true" in config and f'stream_server_address = "{box.machine.ip}"' in config

        # --- the machine is a hypervisor now: init again is refused and changes nothing
        mtime = (box.dir / "containerd.toml").stat().st_mtime_ns
        twice = subprocess.run(box.init_argv(ca_hash), capture_output=True, text=True)
        assert twice.returncode == 1 and "this machine is already a hypervisor" in twice.stderr, twice.stderr
        assert (box.dir / "containerd.toml").stat().st_mtime_ns == mtime
        # --- and the fleet refuses it again under another name (its address is in the repo)
        dup = box.add(fingerprint, check=False, name="hv-again")
        assert dup.returncode == 1 and f"address {box.machine.ip} is Hypervisor hv-new's" in dup.stderr
    finally:
        proc.kill()
        proc.wait()
