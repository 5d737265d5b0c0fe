"""Structured logs: one JSON object per line (or plain text for people)."""
from __future__ import annotations

import json
import logging
import sys

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                data[key] = value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
        if record.exc_info:
            data["error"] = self.formatException(record.exc_info)
        return json.dumps(data, sort_keys=True)


def event(logger: logging.Logger, level: int, message: str, **fields: object) -> None:
    """Log `message key=value ...`, with the fields also as record attributes (JSON keys)."""
    if logger.isEnabledFor(level):
        text = " ".join([message] + [f"{k}={v}" for k, v in fields.items()])
        logger.log(level, "%s", text, extra={"event": message, **fields}, stacklevel=2)


def setup(fmt: str = "json", level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        formatter: logging.Formatter = JsonFormatter()
        formatter.converter = __import__("time").gmtime
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
