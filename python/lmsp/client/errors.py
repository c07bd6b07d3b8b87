"""Exceptions: one class per LMSP problem `code`, made from the service's own table of codes
(`lmsp.protocol.errors.CODES`), so that a code added there has its class here at once."""

from __future__ import annotations

from typing import Any

import orjson

from lmsp.protocol.errors import CODES

__all__ = ["ERRORS", "APIConnectionError", "APIError", "LMSPError"]


class LMSPError(Exception):
    """Anything this client raises."""


class APIConnectionError(LMSPError):
    """No answer from the service after every retry; the last transport error is the cause."""


class APIError(LMSPError):
    """The service answered with a problem document (RFC 9457). Subclasses, one per code, are
    what is raised; this class itself only for an error answer that is not a problem document."""

    code: str | None = None

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        param: str | None = None,
        title: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {self.code or 'error'}: {detail}" + (f" ({param})" if param else ""))
        self.status = status
        self.detail = detail
        self.param = param
        self.title = title
        self.retry_after = retry_after


def _class_name(code: str) -> str:
    return _NAMES.get(code) or "".join(part.capitalize() for part in code.split("_"))


# Where the plain CamelCase of a code reads badly; everything else is named from its code.
_NAMES = {"event_history_expired": "HistoryExpired", "invalid_json": "InvalidJSON"}
assert set(_NAMES) <= set(CODES), "a renamed code is no longer in CODES"

ERRORS: dict[str, type[APIError]] = {
    code: type(
        _class_name(code),
        (APIError,),
        {"code": code, "__doc__": f"{status} `{code}`: {title}.", "__module__": __name__},
    )
    for code, (status, title) in CODES.items()
}
globals().update({cls.__name__: cls for cls in ERRORS.values()})
__all__ += sorted(cls.__name__ for cls in ERRORS.values())


def error_from_answer(status: int, content: bytes, retry_after: float | None = None) -> APIError:
    """The exception for an error answer: its code's class when the body is a problem
    document with a code we know, else APIError."""
    try:
        doc: Any = orjson.loads(content)
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        return APIError(status, content.decode("utf-8", "replace")[:500] or f"HTTP {status}", retry_after=retry_after)
    code = doc.get("code")
    cls = ERRORS.get(code, APIError) if isinstance(code, str) else APIError
    return cls(
        status, str(doc.get("detail", "")), param=doc.get("param"), title=doc.get("title"), retry_after=retry_after
    )
