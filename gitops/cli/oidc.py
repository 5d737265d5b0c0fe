"""`gitops oidc-login` (kubectl's exec plugin for people) and `gitops oidc serve|rotate-keys|hash-password`
(the provider SIP's auth pod runs; see gitops.oidc)."""
from __future__ import annotations

import base64
import binascii
import os
import signal
import sys
from pathlib import Path

import click

from gitops.errors import GitopsError


@click.command("oidc-login")
@click.option("--issuer-url", required=True, help="The OpenID Connect issuer (https).")
@click.option("--client-id", required=True, help="The client the API server trusts (its --oidc-client-id).")
@click.option("--username", required=True, help="Who logs in.")
@click.option("--certificate-authority-data", "ca_data", help="The issuer's CA, PEM in base64 (else the system's).")
@click.option("--ca-file", type=click.Path(dir_okay=False, path_type=Path), help="The issuer's CA, a PEM file.")
def oidc_login(issuer_url: str, client_id: str, username: str, ca_data: str | None, ca_file: Path | None) -> None:
    """Print an ExecCredential with USERNAME's ID token, for kubectl (cached and refreshed under
    $XDG_CACHE_HOME/gitops/oidc; the password from $GITOPS_OIDC_PASSWORD or asked on the terminal)."""
    from gitops.oidc.login import Login, exec_credential, id_token

    ca_pem = ""
    if ca_data:
        try:
            ca_pem = base64.b64decode(ca_data, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as err:
            raise GitopsError(f"--certificate-authority-data is not base64 PEM: {err}") from None
    elif ca_file:
        ca_pem = ca_file.read_text()
    click.echo(exec_credential(*id_token(Login(issuer_url, client_id, username, ca_pem))))


@click.group("oidc")
def oidc() -> None:
    """The OpenID Connect provider of SIP's auth service (it runs in the service's pod)."""


def _become(uid: int | None, keys: str) -> None:
    """Started as root with a uid: the key directory (0700) and what is in it made that uid's, then the process
    runs as it (no supplementary groups), before it reads anything else. Otherwise nothing changes."""
    if uid is None or os.geteuid() != 0:
        return
    os.makedirs(keys, mode=0o700, exist_ok=True)
    for root, _dirs, files in os.walk(keys):
        for path in (root, *(os.path.join(root, f) for f in files)):
            os.lchown(path, uid, uid)
    os.chmod(keys, 0o700)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


@oidc.command("serve")
@click.option("--config", "config", required=True, type=click.Path(exists=True, dir_okay=False),
              help="The provider's JSON configuration (issuer, users with password hashes, clients).")
@click.option("--keys", required=True, type=click.Path(file_okay=False),
              help="Where its signing keys are born and kept (a directory of the machine).")
@click.option("--listen", default="127.0.0.1:5556", show_default=True,
              help="host:port, loopback: the pod's TLS front is its only client.")
@click.option("--user", "uid", type=click.IntRange(1, 2**31 - 1),
              help="Started as root: read the configuration, make the key directory this uid's, then run as it.")
def serve(config: str, keys: str, listen: str, uid: int | None) -> None:
    """Serve the provider until SIGTERM."""
    from gitops.oidc.provider import make_server, read_config

    try:
        loaded = read_config(config)  # before it drops root: the file may be readable by root only
        _become(uid, keys)
        server = make_server(loaded, keys, listen)
    except (ValueError, KeyError) as err:  # a listen address not on loopback, a configuration without its fields
        raise GitopsError(f"gitops oidc serve: {err}") from None
    signal.signal(signal.SIGTERM, lambda *_: server.close())
    click.echo(f"gitops oidc: serving on {listen}", err=True)
    try:
        server.run()
    except (OSError, ValueError):  # closed by SIGTERM
        pass


@oidc.command("rotate-keys")
@click.option("--keys", required=True, type=click.Path(file_okay=False), help="The provider's key directory.")
@click.option("--token-ttl", default=600, show_default=True, help="Seconds its tokens live (old keys stay "
              "published that long).")
@click.option("--user", "uid", type=click.IntRange(1, 2**31 - 1),
              help="Started as root: run as this uid (the provider's, which owns the key directory).")
def rotate_keys(keys: str, token_ttl: int, uid: int | None) -> None:
    """Make a new signing key; the running provider signs with it from its next token on."""
    from gitops.oidc.keys import KeyStore

    _become(uid, keys)

    click.echo(KeyStore(keys, token_ttl).rotate())


@oidc.command("hash-password")
def hash_password() -> None:
    """Read a password (asked, or one line on stdin) and print its bcrypt hash, for a user's passwordHash."""
    from gitops.oidc.passwords import hash_password as make

    password = click.prompt("Password", hide_input=True, confirmation_prompt=True, err=True) if sys.stdin.isatty() \
        else sys.stdin.readline().rstrip("\n")
    if not password:
        raise GitopsError("an empty password")
    try:
        click.echo(make(password))
    except ValueError as err:
        raise GitopsError(str(err)) from None


COMMANDS: list[click.Command] = [oidc_login, oidc]
