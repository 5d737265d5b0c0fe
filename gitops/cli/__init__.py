"""The `gitops` command line. Each sub-module owns one command or group."""
from __future__ import annotations

import logging
import os
import sys

import click

from gitops import __version__
from gitops.errors import GitopsError


class _Group(click.Group):
    """Loads its commands when one is looked up (the command runs, or help lists them), and turns
    GitopsError into a one-line message and exit code 1."""

    def _load(self) -> None:
        if self.commands:
            return
        # gRPC's C core logs TLS handshake failures to stderr, where gitops reports them as CRIErrors
        # already; the command (not the library) quiets it, before its commands load grpc (which reads
        # the setting when it is imported).
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
        from gitops.cli import controller, cri, lab, reconcile, secrets, validate, worker

        for module in (validate, reconcile, controller, cri, lab, worker, secrets):
            for command in module.COMMANDS:
                self.add_command(command)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._load()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self._load()
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except GitopsError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gitops")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def cli(verbose: int) -> None:
    """GitOps reconciler for Kubernetes control planes on CRI hypervisors and bare-metal hosts."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")


def main() -> None:
    cli(prog_name="gitops")
