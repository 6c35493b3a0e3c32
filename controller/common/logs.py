"""Structured logging shared by every xingmai daemon: one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, component: str):
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "component": self.component,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in vars(record).items():  # extra={...} fields
            if k not in _RESERVED and not k.startswith("_"):
                doc[k] = v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def setup_logging(
    component: str, level: str = "info", console: bool = True, file: str | Path | None = None
) -> None:
    """Configure the root logger: JSON lines to stderr and/or a file."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    lvl = {"trace": logging.DEBUG, "warn": logging.WARNING, "off": logging.CRITICAL + 10}.get(
        level.lower(), getattr(logging, level.upper(), logging.INFO)
    )
    root.setLevel(lvl)
    fmt = JsonFormatter(component)
    handlers: list[logging.Handler] = []
    if console:
        handlers.append(logging.StreamHandler(sys.stderr))
    if file:
        Path(file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(file))
    if not handlers:
        handlers.append(logging.NullHandler())
    for h in handlers:
        h.setFormatter(fmt)
        root.addHandler(h)
