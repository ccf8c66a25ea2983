"""Log records that keep their context.

Components log with ``extra={"slot": …, "lsn": …}``; the standard formatter drops those
fields. :class:`ContextFormatter` appends them as ``key=value`` pairs, and
:class:`JsonFormatter` writes one JSON object per line for log shippers. Entry points call
:func:`configure_logging` once.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, Final, TextIO

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD: Final = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None))
) | {"message", "asctime", "taskName"}

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def context_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a call passed with ``extra=``, in the order given."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class ContextFormatter(logging.Formatter):
    """The usual text line, then `` key=value`` for each structured field."""

    def __init__(self, fmt: str = TEXT_FORMAT) -> None:
        super().__init__(fmt)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = context_fields(record)
        if not fields:
            return line
        pairs = " ".join(f"{k}={_text(v)}" for k, v in fields.items())
        head, nl, rest = line.partition("\n")  # keep a traceback below the fields
        return f"{head} {pairs}{nl}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``message``, the fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update({k: _plain(v) for k, v in context_fields(record).items()})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def _text(v: Any) -> str:
    s = str(v)
    return json.dumps(s, ensure_ascii=False) if (not s or any(c.isspace() for c in s)) else s


def _plain(v: Any) -> Any:
    return v if isinstance(v, str | int | float | bool) or v is None else str(v)


def configure_logging(
    level: str | int = "INFO", json_logs: bool = False, stream: TextIO | None = None
) -> None:
    """Send the root logger's records to ``stream`` (stderr) as text with fields, or JSON."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if json_logs else ContextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(
        level if isinstance(level, int) else getattr(logging, level.upper(), logging.INFO)
    )
