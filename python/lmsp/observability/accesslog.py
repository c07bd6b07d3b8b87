"""The access log: one line per request when its answer ends, on the `lmsp.access` logger.

Two formats: `text` for a person (`POST /lmsp/v1/responses 200 812ms model=… in=25 out=16
ttft=412ms token=…`) and `json`, one object a line. Whatever a client sent (the path, the model
id) is escaped before it is written, in both: a control character would otherwise move a
terminal's cursor, recolour it or forge a line (`\\x1b` is written as the four characters
`\\x1b`, a backslash as two). Lines go through a queue to a thread of their own, so that a slow
stderr never holds the event loop.
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
import re
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TextIO

import orjson

if TYPE_CHECKING:
    from .exchange import Exchange

__all__ = ["ACCESS_LOGGER", "LOG_FORMATS", "access_fields", "escape", "start_access_log", "text_line"]

ACCESS_LOGGER = "lmsp.access"
LOG_FORMATS = ("text", "json")

# C0 and C1 controls, DEL, the backslash (so that an escape cannot be forged), line and
# paragraph separators, bidirectional overrides and isolates, and lone surrogates.
_UNSAFE = re.compile("[\\x00-\\x1f\\x7f-\\x9f\\\\\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\\":
        return "\\\\"
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    return _UNSAFE.sub(_escaped, text)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def access_fields(exchange: Exchange, seconds: float) -> dict[str, Any]:
    """The line's fields, escaped; None where the request had none (no model, no token)."""
    traces = exchange.traces
    first = next((t.first_at for t in traces if t.first_at is not None), None)
    return {
        "method": escape(exchange.method),
        "path": escape(exchange.path),
        "status": exchange.status,
        "duration_ms": _ms(seconds),
        "model": None if exchange.model is None else escape(exchange.model),
        "input_tokens": sum(t.input_tokens for t in traces) if traces else None,
        "output_tokens": sum(t.output_tokens for t in traces) if traces else None,
        "ttft_ms": _ms(None if first is None else first - exchange.started),
        "token": None if exchange.token_id is None else escape(exchange.token_id),
    }


def _text_value(value: Any) -> str:
    if value is None:
        return "-"
    text = str(value)
    if not text or any(c in text for c in ' "='):
        return '"' + text.replace('"', '\\"') + '"'
    return text


def text_line(fields: dict[str, Any]) -> str:
    """`METHOD PATH STATUS DURATION key=value…`; values already escaped, quoted if need be."""
    duration = fields["duration_ms"]
    ttft = fields["ttft_ms"]
    return " ".join(
        [
            _text_value(fields["method"]),
            _text_value(fields["path"]),
            _text_value(fields["status"]),
            f"{duration:g}ms",
            f"model={_text_value(fields['model'])}",
            f"in={_text_value(fields['input_tokens'])}",
            f"out={_text_value(fields['output_tokens'])}",
            f"ttft={'-' if ttft is None else f'{ttft:g}ms'}",
            f"token={_text_value(fields['token'])}",
        ]
    )


def _timestamp(record: logging.LogRecord) -> str:
    return (
        datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{_timestamp(record)} {record.getMessage()}"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "lmsp", None)
        if fields is None:  # another record on this logger: its message, escaped
            fields = {"message": escape(record.getMessage())}
        return orjson.dumps({"time": _timestamp(record), **fields}).decode()


def start_access_log(log_format: str, stream: TextIO | None = None) -> logging.handlers.QueueListener:
    """Sends `lmsp.access` to `stream` (stderr) in `log_format`; stop the listener at exit so
    that the last lines are written."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    lines: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(lines, handler)
    logger = logging.getLogger(ACCESS_LOGGER)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # the root logger's handlers (if any) would write it a second time
    logger.addHandler(logging.handlers.QueueHandler(lines))
    listener.start()
    return listener
