"""The `gitops` command line. Each sub-module owns one command or group."""
from __future__ import annotations

import importlib
import logging
import os
import sys

import click

from gitops import __version__
from gitops.errors import GitopsError
from gitops.printable import printable


class _Group(click.Group):
    """Loads its commands when one is looked up (the command runs, or help lists them), and turns
    GitopsError (and an OSError no command caught) into a one-line message and exit code 1."""

    #: the module of each command, so that running one imports only it (`gitops validate` starts in a
    #: fraction of the time the controller's imports take); a name not listed loads them all
    MODULES = {"validate": "validate", "schema": "validate", "plan": "reconcile", "apply": "reconcile",
               "kubeconfig": "reconcile", "reconcile": "controller", "watch": "controller", "status": "controller",
               "cri": "cri", "lab": "lab", "join-token": "worker", "join": "worker", "follow": "worker",
               "leave": "worker",
               "secrets": "secrets", "state": "state", "backup": "backup", "ui": "ui", "status-key": "trust",
               "hypervisor": "hypervisor", "oidc-login": "oidc", "oidc": "oidc"}
    ALL = ("validate", "reconcile", "controller", "cri", "lab", "worker", "secrets", "state", "backup", "ui", "trust",
           "hypervisor", "oidc")

    def _load(self, *names: str) -> None:
        # gRPC's C core logs TLS handshake failures to stderr, where gitops reports them as CRIErrors
        # already; the command (not the library) quiets it, before its commands load grpc (which reads
        # the setting when it is imported).
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
        for name in names or self.ALL:
            module = importlib.import_module(f"gitops.cli.{name}")
            for command in module.COMMANDS:
                if command.name not in self.commands:
                    self.add_command(command)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._load()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            module = self.MODULES.get(cmd_name)
            self._load(*([module] if module else []))
            if cmd_name not in self.commands and module:
                self._load()
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except GitopsError as err:
            click.echo(f"error: {printable(str(err), keep_newlines=True)}", err=True)
            sys.exit(1)
        except OSError as err:  # a file or directory the command could not use: one line, not a traceback
            where = f"{printable(str(err.filename))}: " if err.filename else ""
            click.echo(f"error: {where}{err.strerror or err}", err=True)
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
