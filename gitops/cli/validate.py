"""`gitops validate` and `gitops schema`."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import click

from gitops.cli.secrets import IDENTITY_ENV, identity_option, read_identity
from gitops.errors import GitopsError
from gitops.model import schemas
from gitops.model.diagnostics import MAX_SHOWN, capped
from gitops.model.validate import validate_repo
from gitops.printable import printable


@click.command()
@click.argument("repo", default=".", type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@identity_option
def validate(repo: Path, output: str, identity: Path | None) -> None:
    """Check every document of REPO against the schemas and the semantic rules.

    With an identity, encrypted secret fields are decrypted (in memory) and checked like
    plaintext ones; one that does not decrypt is an error. Without one, only their armor is
    checked, and validate says so. Exits 0 when the repo is valid, 1 with every error
    (file:line: Kind/name: field: message).
    """
    result = validate_repo(repo, read_identity(identity), sealed_ok=True)
    kinds = Counter(doc.kind for doc in result.repo.documents if doc.kind)
    summary = {
        "documents": len(result.repo.documents),
        "files": len(result.repo.files),
        "kinds": dict(sorted(kinds.items())),
    }
    if output == "json":
        payload = {
            "repo": str(repo),
            "valid": result.ok,
            "errors": [d.to_dict() for d in result.diagnostics[:MAX_SHOWN]],
            "errorCount": len(result.diagnostics),
            "warnings": [d.to_dict() for d in result.warnings[:MAX_SHOWN]],
            "notDecrypted": [d.to_dict() for d in result.sealed],
            "summary": summary,
        }
        click.echo(json.dumps(payload, indent=2, sort_keys=True))
        raise SystemExit(0 if result.ok else 1)
    for warning in capped(result.warnings, "warning"):
        click.echo(f"warning: {warning}", err=True)
    if result.sealed:
        click.echo(f"note: {len(result.sealed)} encrypted secret field(s) not decrypted (no --identity or "
                   f"${IDENTITY_ENV}): their armor was checked, not what they hold", err=True)
    if result.ok:
        counts = ", ".join(f"{n} {kind}" for kind, n in summary["kinds"].items()) or "no resources"
        click.echo(f"ok: {printable(str(repo))}: {summary['documents']} documents in {summary['files']} files ({counts})")
    else:
        for line in capped(result.diagnostics):
            click.echo(line, err=True)
        files = len({d.file for d in result.diagnostics})
        click.echo(f"invalid: {len(result.diagnostics)} error(s) in {files} file(s)", err=True)
    raise SystemExit(0 if result.ok else 1)


@click.command()
@click.argument("kind", required=False, type=click.Choice(sorted(schemas.KINDS), case_sensitive=False))
@click.option("--write", "write_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write every schema file into this directory instead of printing.")
def schema(kind: str | None, write_dir: Path | None) -> None:
    """Print the JSON Schema of KIND, or write all schemas for editors (--write DIR)."""
    if write_dir is not None:
        for name, filename in sorted(schemas.KINDS.items()):
            target = write_dir / filename
            try:
                write_dir.mkdir(parents=True, exist_ok=True)
                target.write_text(schemas.schema_text(name), encoding="utf-8")
            except OSError as err:
                raise GitopsError(f"cannot write {printable(str(target))}: {err.strerror or err}") from None
            click.echo(printable(str(target)))
        return
    if kind is None:
        for name, filename in sorted(schemas.KINDS.items()):
            click.echo(f"{name}\t{filename}")
        return
    canonical = {k.lower(): k for k in schemas.KINDS}[kind.lower()]
    click.echo(schemas.schema_text(canonical), nl=False)


COMMANDS: list[click.Command] = [validate, schema]
