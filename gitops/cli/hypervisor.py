"""`gitops hypervisor`: make a machine a Hypervisor of the fleet (`init` on it, `add` where gitops runs)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from gitops.cli.reconcile import load, repo_argument, state_option, state_store
from gitops.hypervisor import configs


@click.group("hypervisor")
def hypervisor() -> None:
    """Onboard a machine as a Hypervisor: `ca-hash` and `add` where gitops runs, `init` on the machine."""


@hypervisor.command("ca-hash")
@repo_argument
@state_option
def ca_hash_cmd(repo: Path, state_dir: Path | None) -> None:
    """Print the fleet's hypervisor CA hash (sha256:...) for `gitops hypervisor init --ca-hash` on a new machine.
    The CA is made in the recorded state the first time."""
    from gitops.hypervisor.fleet import ca_hash, fleet_ca

    store = state_store(repo, state_dir)
    before = store.load()
    state, ca = fleet_ca(before)
    if state is not before:
        store.save(state)
        click.echo("made the fleet's hypervisor CA (kept in the recorded state)", err=True)
    click.echo(ca_hash(ca))


@hypervisor.command("init")
@click.option("--address", required=True, help="This machine's address the fleet reaches (one of its own).")
@click.option("--ca-hash", "ca_hash", required=True, metavar="sha256:...",
              help="The fleet's hypervisor CA, as `gitops hypervisor ca-hash` prints it where gitops runs.")
@click.option("--cri-port", type=int, default=configs.DEFAULT_CRI_PORT, show_default=True,
              help="Port of the TLS-only CRI front.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=Path("/var/lib/gitops-hypervisor"), show_default=True,
              help="Where the front's key, certificates and config live (the key never leaves it).")
@click.option("--containerd-config", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("/etc/containerd/config.toml"), show_default=True, help="containerd's config file.")
@click.option("--containerd-binary", default="containerd", show_default=True,
              help="The containerd that reads that config (a name on PATH, or a path; its runc shim beside it is "
                   "used): its --version decides the config version (4 from 2.4, 3 for 2.0-2.3, 2 for 1.6 and 1.7).")
@click.option("--containerd-root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep all of containerd's paths under this directory (root, state, socket) instead of Debian's "
                   "(/var/lib/containerd, /run/containerd).")
@click.option("--restart", default="systemctl restart containerd", show_default=True,
              help="Command that restarts containerd when its config changed ('' = none: it is started otherwise).")
@click.option("--data-dir", default="/var/lib/gitops", show_default=True,
              help="Where gitops keeps node files on this machine (the Hypervisor's data dir).")
@click.option("--sandbox-image", default=configs.DEFAULT_SANDBOX_IMAGE, show_default=True)
@click.option("--timeout", type=float, default=3600, show_default=True,
              help="Seconds to wait for `gitops hypervisor add`.")
@click.option("--port-range", default="30000-30999", show_default=True, callback=lambda c, p, v: _port_range(c, p, v),
              help="Ports gitops may give its pods here (the same as `add --port-range`): kept out of the "
                   "kernel's ephemeral ports.")
@click.option("--sysctl-file", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("/etc/sysctl.d/60-gitops-hypervisor.conf"), show_default=True,
              help="Where that reservation is kept for the next boot.")
@click.option("--no-front", is_flag=True, help="Write the front's config and exit instead of running it "
                                               "(haproxy -db -f DIR/front.cfg, e.g. under systemd).")
def init_cmd(address: str, ca_hash: str, cri_port: int, directory: Path, containerd_config: Path,
             containerd_binary: str, containerd_root: Path | None, restart: str, data_dir: str, sandbox_image: str, timeout: float,
             port_range: tuple[int, int], sysctl_file: Path, no_front: bool) -> None:
    """On the new machine: reserve the pods' ports, configure containerd as gitops needs it, make the front's key here, wait for the
    fleet (`gitops hypervisor add`) to sign it, then run the TLS-only CRI front (haproxy, in the foreground)."""
    from gitops.hypervisor.machine import MachineSpec, init

    paths = configs.ContainerdPaths.under(containerd_root) if containerd_root else configs.ContainerdPaths.system()
    spec = MachineSpec(address=address, ca_hash=ca_hash, directory=directory.absolute(), cri_port=cri_port,
                       containerd_config=containerd_config, containerd_binary=containerd_binary, paths=paths,
                       restart=restart,
                       sandbox_image=sandbox_image, data_dir=data_dir, port_range=port_range,
                       sysctl_file=sysctl_file)
    done = init(spec, lambda line: click.echo(line, err=True), timeout=timeout)
    if no_front:
        click.echo(f"the front's config: {done.front_config} (run: haproxy -db -f {done.front_config})", err=True)
        return
    sys.stderr.flush()
    os.execvp("haproxy", ["haproxy", "-db", "-f", str(done.front_config)])


def _port_range(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[int, int]:
    low, sep, high = value.partition("-")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise click.BadParameter("LOW-HIGH, e.g. 30000-30999")
    return int(low), int(high)


def _label(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    out = []
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r}: KEY=VALUE")
        out.append((key, val))
    return tuple(out)


@hypervisor.command("add")
@repo_argument
@click.option("--name", required=True, help="The new Hypervisor's name (hypervisors/NAME.yaml).")
@click.option("--address", required=True, help="The machine's address (as given to `init` there).")
@click.option("--cri-port", type=int, default=configs.DEFAULT_CRI_PORT, show_default=True)
@click.option("--fingerprint", required=True, metavar="sha256:...", help="The machine's key, as `init` printed it.")
@click.option("--public", is_flag=True, help="A public hypervisor (ingress nodes go there).")
@click.option("--port-range", default="30000-30999", show_default=True, callback=_port_range,
              help="Ports gitops may give its pods on the machine.")
@click.option("--label", "labels", multiple=True, callback=_label, metavar="KEY=VALUE",
              help="A label of the Hypervisor (repeatable; e.g. topology.gitops.infra/zone=core-a).")
@state_option
def add_cmd(repo: Path, name: str, address: str, cri_port: int, fingerprint: str, public: bool,
            port_range: tuple[int, int], labels: tuple[tuple[str, str], ...], state_dir: Path | None) -> None:
    """Where gitops runs: sign the waiting machine's key with the fleet's hypervisor CA, hand it its certificate,
    check its CRI answers over mutual TLS, and write hypervisors/NAME.yaml (client key age-encrypted to
    gitops.yaml's recipients) for a pull request."""
    from gitops.hypervisor.fleet import NewHypervisor, add

    result = load(repo, sealed_ok=True)
    config = result.repo.config
    new = NewHypervisor(name, address, cri_port, fingerprint, public, port_range[0], port_range[1], labels)
    store = state_store(repo, state_dir)
    _, path, already = add(new, result.model.hypervisors, repo, config.secrets.recipients, store.load(), store.save,
        plaintext_ok=config.allow_plaintext)
    if already:
        click.echo(f"{name} was onboarded by an earlier run (its front answers with the fleet's CA); {path} is "
                   "its document", err=True)
    else:
        click.echo(f"wrote {path}: review it in a pull request; once merged, gitops places nodes on {name}", err=True)
    click.echo(str(path))


COMMANDS: list[click.Command] = [hypervisor]
