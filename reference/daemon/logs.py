"""The daemon's log format: one JSON object per line on stderr, for its own records and gunicorn's alike.

Each line is ``{"ts", "level", "logger", "msg"}`` (``ts`` RFC 3339 UTC with milliseconds), plus ``"exc"`` when the
record carries an exception, so ``jq`` and log shippers read every line the daemon writes.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from gunicorn.glogging import Logger as GunicornLogger


class JsonLines(logging.Formatter):
    """Formats a record as one JSON object on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
                 "level": record.levelname, "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str) -> None:
    """Send the root logger's records to stderr as JSON lines at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    logging.basicConfig(level=level, handlers=[handler], force=True)


class JsonGunicornLogger(GunicornLogger):
    """gunicorn's error log (its start, worker and signal messages) in the daemon's JSON lines."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for handler in self.error_log.handlers:
            handler.setFormatter(JsonLines())
