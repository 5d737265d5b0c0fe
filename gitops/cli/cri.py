"""`gitops cri`: crictl-like, read-only views of the hypervisors' container runtimes."""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from gitops.cli.secrets import read_identity
from gitops.cri.client import CRIClient, read_all
from gitops.cri.errors import CRIError
from gitops.errors import GitopsError
from gitops.model.resources import Hypervisor
from gitops.model.validate import load_hypervisors


def _load(repo: str | None, hypervisors_file: str | None) -> dict[str, Hypervisor]:
    """The validated hypervisors of a repo, or of a file of Hypervisor documents (keys decrypted with $GITOPS_IDENTITY)."""
    return dict(sorted(load_hypervisors(Path(hypervisors_file or repo or "."), read_identity(None)).items()))


def _select(hvs: dict[str, Hypervisor], names: Sequence[str]) -> list[Hypervisor]:
    unknown = sorted(set(names) - set(hvs))
    if unknown:
        raise GitopsError(f"unknown hypervisor(s): {', '.join(unknown)} (known: {', '.join(hvs) or 'none'})")
    return [hvs[n] for n in (sorted(set(names)) if names else hvs)]


def _labels(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise GitopsError(f"--label wants key=value, not {pair!r}")
        out[key] = value
    return out


def _time(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if ns else "-"


def _table(header: Sequence[str], rows: list[Sequence[str]]) -> None:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    for row in [header, *rows]:
        click.echo("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())


def _gather(ctx_args: dict[str, Any], read: Callable[[CRIClient], list[Any]]) -> list[tuple[str, Any]]:
    hvs = _select(_load(ctx_args["repo"], ctx_args["hypervisors_file"]), ctx_args["hypervisor"])
    results = read_all([hv.cri_endpoint() for hv in hvs], read, timeout=ctx_args["timeout"])
    rows: list[tuple[str, Any]] = []
    failed: list[CRIError] = []
    for name, result in results.items():
        if isinstance(result, CRIError):
            failed.append(result)
        else:
            rows += [(name, item) for item in result]
    ctx_args["_failed"] = failed
    return rows


def _finish(ctx_args: dict[str, Any]) -> None:
    failed: list[CRIError] = ctx_args.get("_failed", [])
    for err in failed:
        click.echo(f"error: {err}", err=True)
    if failed:
        raise SystemExit(1)


def _common(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.argument("repo", required=False, type=click.Path(file_okay=False))(f)
    f = click.option("--hypervisors-file", "-f", type=click.Path(exists=True, dir_okay=False),
                     help="YAML file of Hypervisor documents (e.g. from `gitops lab up`).")(f)
    f = click.option("--hypervisor", "-H", multiple=True, metavar="NAME",
                     help="Only this hypervisor (repeatable); default: all.")(f)
    f = click.option("--timeout", type=float, default=10.0, show_default=True,
                     help="Deadline per hypervisor, in seconds.")(f)
    return f


@click.group("cri")
def cri() -> None:
    """Read-only views of the hypervisors' container runtimes (CRI)."""


@cri.command("version")
@_common
def version_cmd(**args: Any) -> None:
    """Runtime name, version and readiness per hypervisor."""
    rows = _gather(args, lambda c: [(c.version(), c.status())])
    _table(["HYPERVISOR", "RUNTIME", "VERSION", "API", "READY"],
           [(hv, v.runtime_name, v.runtime_version, v.runtime_api_version, str(s.ready).lower())
            for hv, (v, s) in rows])
    _finish(args)


@cri.command("pods")
@_common
@click.option("--label", "-l", multiple=True, metavar="KEY=VALUE", help="Label filter (repeatable).")
def pods_cmd(label: Sequence[str], **args: Any) -> None:
    """Pod sandboxes, like `crictl pods`."""
    labels = _labels(label)
    rows = _gather(args, lambda c: c.list_sandboxes(labels))
    _table(["HYPERVISOR", "POD ID", "CREATED", "STATE", "NAME", "NAMESPACE", "ATTEMPT"],
           [(hv, s.id[:13], _time(s.created_at), s.state.value, s.name, s.namespace, str(s.attempt))
            for hv, s in rows])
    _finish(args)


@cri.command("ps")
@_common
@click.option("--label", "-l", multiple=True, metavar="KEY=VALUE", help="Label filter (repeatable).")
def ps_cmd(label: Sequence[str], **args: Any) -> None:
    """Containers (all states), like `crictl ps -a`."""
    labels = _labels(label)
    rows = _gather(args, lambda c: c.list_containers(labels))
    _table(["HYPERVISOR", "CONTAINER", "IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT", "POD ID"],
           [(hv, c.id[:13], c.image, _time(c.created_at), c.state.value, c.name, str(c.attempt),
             c.sandbox_id[:13]) for hv, c in rows])
    _finish(args)


@cri.command("images")
@_common
def images_cmd(**args: Any) -> None:
    """Images, like `crictl images`."""
    rows = _gather(args, lambda c: c.list_images())
    table = []
    for hv, img in rows:
        for tag in img.repo_tags or ("<none>:<none>",):
            repo, _, version = tag.rpartition(":")
            table.append((hv, repo, version, img.id.removeprefix("sha256:")[:13], str(img.size)))
    _table(["HYPERVISOR", "IMAGE", "TAG", "IMAGE ID", "SIZE"], table)
    _finish(args)


COMMANDS: list[click.Command] = [cri]
