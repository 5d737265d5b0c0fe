"""Structured log events: `message key=value ...`, with the fields also in `extra`."""
from __future__ import annotations

import logging


def event(logger: logging.Logger, level: int, message: str, **fields: object) -> None:
    if logger.isEnabledFor(level):
        text = " ".join([message] + [f"{k}={v}" for k, v in fields.items()])
        logger.log(level, "%s", text, extra={"event": message, **fields}, stacklevel=2)
