"""`gitops lab`: a local lab of containerd hypervisors for development and tests."""
from __future__ import annotations

import os

from pathlib import Path

import click

from gitops import lab as labmod
from gitops.lab.kubebin import KUBERNETES_BUILT
from gitops.lab.recipes import DEFAULT_KUBERNETES_VERSIONS

_DIR = click.option("--dir", "lab_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                    help="Lab directory (default: $GITOPS_LAB_DIR or ./.lab).")


@click.group("lab")
def lab() -> None:
    """Real containerd hypervisors, each a machine of its own on the lab's network (needs root)."""


@lab.command("up")
@click.option("--hypervisors", "-n", type=int, default=1, show_default=True, help="How many hypervisors.")
@click.option("--public", type=int, default=0, show_default=True, help="How many of them are public.")
@click.option("--remote", is_flag=True, help="Put an mTLS haproxy front on each CRI socket.")
@click.option("--subnet", default=labmod.lab.DEFAULT_SUBNET, show_default=True,
              help="127.0.T: the host's loopback source towards the lab (127.0.T.254) and the lab network's "
                   "number (hypervisors 10.249.T.N, workers 10.250.T.N).")
@click.option("--kubernetes-versions", default=",".join(DEFAULT_KUBERNETES_VERSIONS), show_default=True,
              help="Comma-separated Kubernetes versions to import the real control-plane binaries of, with the "
                   "etcd each runs by default (tagged registry.k8s.io/kube-*:v<version>, registry.k8s.io/etcd:"
                   f"<version>-0); built here: {', '.join(KUBERNETES_BUILT)}.")
@click.option("--etcd-versions", default="", help="Comma-separated etcd versions to import besides those.")
@click.option("--data-tmpfs", "data_tmpfs_mib", type=int, default=0, metavar="MIB",
              help="Each hypervisor's node data (etcd's WAL and database) on a tmpfs of MIB MiB: the dedicated "
                   "disk etcd asks for, where the host's one disk is shared with other work (0: the lab "
                   "directory's disk).")
@_DIR
def up_cmd(hypervisors: int, public: int, remote: bool, subnet: str, kubernetes_versions: str,
           etcd_versions: str, data_tmpfs_mib: int, lab_dir: Path | None) -> None:
    """Start the lab and print its Hypervisor documents (YAML) on stdout."""
    versions = [v for v in (part.strip() for part in kubernetes_versions.split(",")) if v]
    etcd = [v for v in (part.strip() for part in etcd_versions.split(",")) if v]
    info = labmod.up(lab_dir, hypervisors=hypervisors, public=public, remote=remote, subnet=subnet,
                     kubernetes_versions=versions, etcd_versions=etcd, data_tmpfs_mib=data_tmpfs_mib)
    click.echo(labmod.hypervisors_yaml(info), nl=False)
    click.echo(f"lab up in {info.dir}: {len(info.hypervisors)} hypervisor(s)", err=True)


@lab.command("hypervisors")
@_DIR
def hypervisors_cmd(lab_dir: Path | None) -> None:
    """Print the running lab's Hypervisor documents (YAML)."""
    click.echo(labmod.hypervisors_yaml(labmod.info(lab_dir)), nl=False)


@lab.command("status")
@_DIR
def status_cmd(lab_dir: Path | None) -> None:
    """Show the lab's hypervisors and whether its processes run."""
    st = labmod.status(lab_dir)
    click.echo(f"lab {st.dir}: {'up' if st.up else 'DEGRADED'}")
    from gitops.lab import network

    for hv in st.hypervisors:
        endpoint = hv.remote_uri or f"unix://{hv.socket}"
        machine = ""
        if hv.netns:
            cut = network.partitioned_from(hv.machine())
            machine = (f"  netns={hv.netns}  link={'up' if network.link_up(hv.machine()) else 'DOWN'}"
                       f"  rss={network.rss_kib(hv.netns) // 1024}MiB"
                       + (f"  partitioned-from={'everything' if cut == ['*'] else ','.join(cut)}" if cut else ""))
        click.echo(f"  {hv.name}  ip={hv.ip}  ports={hv.port_range.low}-{hv.port_range.high}  "
                   f"public={str(hv.public).lower()}  cri={endpoint}{machine}")
    for p in st.processes:
        click.echo(f"  {p.proc.hypervisor}  {p.proc.role}  pid={p.proc.pid}  "
                   f"{'running' if p.alive else 'GONE'}  log={p.proc.log}")
    click.echo(f"  mounts under lab dir: {len(st.mounts)}")
    for version, etcd in sorted(st.kubernetes.items()):
        click.echo(f"  kubernetes {version}: real binaries (etcd {etcd} by default)")
    if st.images:
        click.echo("  images:")
        for role, ref in sorted(st.images.items()):
            click.echo(f"    {role}  {ref}")
    if st.aliases:
        click.echo("  aliases:")
        for alias, ref in sorted(st.aliases.items()):
            click.echo(f"    {alias} -> {ref}")
    if not st.up:
        raise SystemExit(1)


@lab.command("down")
@_DIR
def down_cmd(lab_dir: Path | None) -> None:
    """Stop everything the lab started, unmount and remove its files; a worker still joined on a lab worker
    goes with it (its kubelet and kube-proxy stopped, kubelet's mounts undone, its directory removed)."""
    report = labmod.down(lab_dir)
    for what in report.stopped:
        click.echo(f"stopped {what}")
    for what in report.workers:
        click.echo(f"worker {what}")
    click.echo(f"unmounted {len(report.unmounted)}, lab directory {'removed' if report.removed else 'kept'}")


@lab.command("example-repo")
@click.argument("target", type=click.Path(file_okay=False, path_type=Path))
@_DIR
@click.option("--encrypt-to", "recipients", multiple=True, metavar="AGE1...",
              help="Write the lab's mTLS client keys age-encrypted to this recipient (repeatable; e.g. the "
                   "controller's), and refuse plaintext keys in gitops.yaml. Default: plaintext, allowed for labs.")
@click.option("--ingress-nodes", type=click.IntRange(1, 7), default=None,
              help="Ingress nodes per example cluster (default: the example's two). With 2 or more, each cluster is "
                   "reached at a virtual IP of the lab's pool, its ingress nodes on distinct public machines (the lab "
                   "needs as many); with 1, at its ingress node's machine.")
@click.option("--oidc-user", metavar="USERNAME",
              help="Declare this user in tenant-1's OIDC provider (its pod then runs: gitops lab images oidc first), "
                   "and make team-a trust that provider.")
@click.option("--oidc-password-hash", metavar="HASH", help="The user's password hash (gitops oidc hash-password).")
def example_repo_cmd(target: Path, lab_dir: Path | None, recipients: tuple[str, ...],
                     ingress_nodes: int | None, oidc_user: str | None, oidc_password_hash: str | None) -> None:
    """Write the example repo to TARGET with its Hypervisors pointing at this lab."""
    from gitops.lab.example import declare_oidc_user, write_example_repo

    if (oidc_user is None) != (oidc_password_hash is None):
        raise click.UsageError("--oidc-user and --oidc-password-hash go together")
    for line in write_example_repo(labmod.info(lab_dir), target, recipients=recipients, ingress_nodes=ingress_nodes):
        click.echo(line, err=True)
    if oidc_user is not None and oidc_password_hash is not None:
        declare_oidc_user(target, oidc_user, oidc_password_hash)
        click.echo(f"{oidc_user}: a user of tenant-1's OIDC provider, which team-a trusts", err=True)
    click.echo(str(target))


@lab.group("images")
def images_group() -> None:
    """Images in the lab's hypervisors."""


@images_group.command("oidc")
@_DIR
def images_oidc_cmd(lab_dir: Path | None) -> None:
    """Build the image SIP's OIDC provider runs (this gitops, on this interpreter) and import it into the lab's
    public hypervisors, where auth pods run; prints its ref."""
    click.echo(labmod.lab.import_provider_image(labmod.info(lab_dir)))


@images_group.command("import")
@click.argument("tarball", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_DIR
def images_import_cmd(tarball: Path, lab_dir: Path | None) -> None:
    """Import an image tarball (docker/OCI archive) into every lab hypervisor."""
    for name in labmod.import_image(tarball, lab_dir):
        click.echo(f"imported {tarball.name} into {name}")


@images_group.command("alias")
@click.argument("src")
@click.argument("dst")
@_DIR
def images_alias_cmd(src: str, dst: str, lab_dir: Path | None) -> None:
    """Tag image SRC as DST in every lab hypervisor that has it (e.g. an upstream name a cluster uses)."""
    for name in labmod.alias_image(src, dst, lab_dir):
        click.echo(f"tagged {src} as {dst} in {name}")


COMMANDS: list[click.Command] = [lab]



@lab.command("worker")
@click.option("--number", type=int, default=1, show_default=True, help="Which lab worker (lab-worker-N).")
@_DIR
def worker_cmd(number: int, lab_dir: Path | None) -> None:
    """Give lab-worker-N its own network namespace (node address 10.250.T.N, on the lab bridge)
    and its own containerd there (bridge CNI); print the `gitops join` flags for it, one per line.
    Run `gitops join` and `gitops leave` on it with `gitops lab exec lab-worker-N -- ...`."""
    from gitops.lab.worker import prepare

    for flag in prepare(number, lab_dir).join_flags():
        click.echo(flag)


@lab.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("worker")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
@_DIR
def exec_cmd(worker: str, argv: tuple[str, ...], lab_dir: Path | None) -> None:
    """Run a command on lab machine WORKER (a worker such as lab-worker-1, or a hypervisor such as lab-hv-1):
    in its network namespace, as on that machine.

    \b
    gitops lab exec lab-worker-1 -- gitops join https://... --token ... FLAGS...
    gitops lab exec lab-worker-1 -- gitops leave
    gitops lab exec lab-hv-1 -- ip -br addr"""
    from gitops.lab.worker import run

    lab = labmod.info(lab_dir)
    hv = next((h for h in lab.hypervisors if h.name == worker), None)
    if hv is not None:
        full = hv.run(list(argv))
        os.execvp(full[0], full)
    run(worker, list(argv), lab_dir)


@lab.command("check-host")
@_DIR
def check_host_cmd(lab_dir: Path | None) -> None:
    """Check that the lab left nothing on the host's network: no address added to a host interface since
    `lab up` (only 127.0.0.0/8 and ::1 are allowed), no KUBE-* chain in the host's iptables. Exit 1 if not."""
    from gitops.lab import hostcheck

    found = hostcheck.problems(labmod.info(lab_dir).dir)
    for line in found:
        click.echo(line)
    if found:
        raise SystemExit(1)
    click.echo("host: no address added outside 127.0.0.0/8 and ::1, no KUBE-* chain in its iptables")


@lab.command("poweroff")
@click.argument("name")
@_DIR
def poweroff_cmd(name: str, lab_dir: Path | None) -> None:
    """Cut the power of lab hypervisor NAME: every process on it SIGKILLed at once, its link down."""
    killed = labmod.power_off(lab_dir, name)
    click.echo(f"{name}: powered off ({killed} process(es) killed, link down)")


@lab.command("poweron")
@click.argument("name")
@_DIR
def poweron_cmd(name: str, lab_dir: Path | None) -> None:
    """Boot lab hypervisor NAME as after a power cut: link up, containerd (and its mTLS front) started on its
    disk; its pods are as a reboot leaves them (known, not running) until an apply brings them back."""
    started = labmod.power_on(lab_dir, name)
    click.echo(f"{name}: powered on ({', '.join(f'{p.role}[{p.pid}]' for p in started)})")


@lab.command("partition")
@click.argument("name")
@click.option("--from", "peers", multiple=True, metavar="OTHER",
              help="Cut NAME only from this lab machine (repeatable; `host` is the host where gitops runs). "
                   "Default: from everything.")
@_DIR
def partition_cmd(name: str, peers: tuple[str, ...], lab_dir: Path | None) -> None:
    """Drop lab machine NAME's traffic both ways while its processes keep running (`heal` undoes it)."""
    cut = labmod.partition(lab_dir, name, peers)
    click.echo(f"{name}: partitioned from {'everything' if cut == ['*'] else ', '.join(cut)}")


@lab.command("heal")
@click.argument("name")
@_DIR
def heal_cmd(name: str, lab_dir: Path | None) -> None:
    """Undo every partition of lab machine NAME."""
    healed = labmod.heal(lab_dir, name)
    click.echo(f"{name}: {'healed' if healed else 'was not partitioned'}")
