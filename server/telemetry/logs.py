"""Structured server logs: ``key=value`` fields (or one JSON object a line), secrets masked.

Session code logs through :func:`session_logger`, which tags every line with
the session id. Transcript and reply text is logged only at debug level.
Every line goes through :class:`RedactFilter`, so a token that reaches a log
message anyway (uvicorn's access lines print the query string) is masked.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable, MutableMapping
from typing import Any

from kame.redaction import redact

_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys() | {"message", "asctime", "taskName", "color_message"}
)


def _extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")}


class KeyValueFormatter(logging.Formatter):
    """``time level logger: message key=value ...``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _extra_fields(record)
        if fields:
            line += " " + " ".join(f"{k}={_kv(v)}" for k, v in fields.items())
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg plus the extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _extra_fields(record).items():
            out[key] = value if isinstance(value, (int, float, bool, str)) or value is None else str(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def _kv(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if (" " in text or not text) else text


class RedactFilter(logging.Filter):
    """Masks tokens in the formatted message and in exception text."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string must not lose the line
            message = str(record.msg)
        clean = redact(message, self.secrets)
        if clean != message or record.args:
            record.msg, record.args = clean, None
        if record.exc_info and self.secrets:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
            record.exc_text = None
            record.msg = f"{record.msg}\n{redact(text, self.secrets)}"
        return True


def configure_logging(level: str = "info", json_format: bool = False, secrets: Iterable[str] = ()) -> None:
    """Replace the root handlers with one stderr handler (uvicorn's loggers propagate to it)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_format else KeyValueFormatter())
    handler.addFilter(RedactFilter(secrets))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True


class SessionLogger(logging.LoggerAdapter[logging.Logger]):
    """Adds ``session=<id>`` (and any fields given) to every line."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(self.extra or {})
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        return msg, kwargs


def session_logger(session_id: str, name: str = "kame.session") -> SessionLogger:
    return SessionLogger(logging.getLogger(name), {"session": session_id})
