"""`gitops validate` and `gitops schema`."""
from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
