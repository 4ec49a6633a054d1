"""Logging: one JSON object per line, and one "log this once" helper for the agent.

The agent logs to stderr as JSON lines (docs/agent.md, "Logs"); loggers are named by
module (``logging.getLogger(__name__)``). A problem that repeats every interval (the same
bad object, the same failing lookup) is logged once, then only counted
(:class:`LogOnce`).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Hashable, Mapping
from typing import Any

from agent.errors import InputError

__all__ = ["JsonFormatter", "LogOnce", "setup_logging"]


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``{"ts", "level", "logger", "msg"}`` plus ``error`` (the
    exception's one-line text) and any ``extra={"fields": {...}}`` given to the call."""

    def format(self, record: logging.LogRecord) -> str:
        """Return ``record`` as one line of JSON (``ts`` in Unix seconds, 3 decimals)."""
        doc: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            doc.update(fields)
        if record.exc_info and record.exc_info[1] is not None:
            err = record.exc_info[1]
            doc["error"] = f"{type(err).__name__}: {err}".replace("\n", " ")
        return json.dumps(doc, default=str, sort_keys=False)


def setup_logging(level: str = "info", stream: Any = None) -> None:
    """Send every log record to ``stream`` (default stderr) as one JSON line.

    Args:
        level: ``debug``, ``info``, ``warning`` or ``error`` (any case).
        stream: a text stream; default ``sys.stderr``.

    Raises:
        InputError: unknown level name (``--log-level``).
    """
    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        raise InputError(f"unknown level {level!r} (debug, info, warning, error)",
                         source="--log-level")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(lvl)


class LogOnce:
    """Log a message the first time its key comes up, then never again for that key.

    For problems that repeat every interval (an error type, a bad object): the first
    occurrence is logged with its details, later ones are only counted by the caller.
    Not thread-safe; each stage keeps its own.

    Args:
        logger: where the messages go.
        limit: keys remembered; once full, messages with new keys are dropped (a stream
            of distinct bad objects cannot grow memory or flood the log).
    """

    def __init__(self, logger: logging.Logger, limit: int = 10_000) -> None:
        self.logger = logger
        self.limit = limit
        self._seen: set[Hashable] = set()

    def __call__(self, key: Hashable, level: int, msg: str, *args: object,
                 exc: BaseException | None = None, **kwargs: Any) -> bool:
        """Log ``msg % args`` at ``level`` unless ``key`` was logged before.

        Args:
            key: what makes two occurrences "the same" (e.g. ``"drain:" + error type``).
            level: a :mod:`logging` level (``logging.WARNING``...).
            msg, args: the message, %-formatted by :mod:`logging`.
            exc: an exception to attach (``exc_info``); its one-line text becomes the
                JSON ``error`` field.
            kwargs: passed to :meth:`logging.Logger.log` (``extra=``).

        Returns:
            True when the message was logged now.
        """
        if key in self._seen or len(self._seen) >= self.limit:
            return False
        self._seen.add(key)
        self.logger.log(level, msg, *args, exc_info=exc, **kwargs)
        return True

    def seen(self, key: Hashable) -> bool:
        """True when ``key`` was logged already."""
        return key in self._seen
