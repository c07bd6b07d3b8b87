"""lmsp.Client's surface without a server (lmsp/client/): the result dataclasses have the
protocol's fields, the exported names, one exception class per problem code, and the retry
decisions."""

from __future__ import annotations

import dataclasses

import orjson

import lmsp
import lmsp.client
from lmsp.client import ERRORS, APIError, AsyncClient, Client, Response, Retry, Task
from lmsp.client.errors import error_from_answer
from lmsp.client.retry import Attempts, retry_after_seconds
from lmsp.protocol.errors import CODES, problem
from lmsp.protocol.models import MODEL as MODEL_SCHEMA
from lmsp.protocol.responses import RESPONSE
from lmsp.protocol.tasks import TASK


def test_results_have_the_fields_of_the_protocol():
    # The dataclasses are hand-written; the schemas are what the service is checked against.
    def names(cls: type) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    assert names(Response) == set(RESPONSE["fields"])
    assert names(Task) == set(TASK["fields"])
    assert names(lmsp.client.Model) == set(MODEL_SCHEMA["fields"])


def test_exported_names():
    assert set(lmsp.client.__all__) == {n for n in dir(lmsp.client) if not n.startswith("_")} - {
        "aio",
        "calls",
        "errors",
        "retry",
        "sse",
        "sync",
        "types",
    }
    assert lmsp.Client is Client and lmsp.AsyncClient is AsyncClient


def test_one_exception_class_per_code():
    assert set(ERRORS) == set(CODES)
    for code, (status, _title) in CODES.items():
        cls = ERRORS[code]
        assert issubclass(cls, APIError) and cls.code == code and getattr(lmsp.client, cls.__name__) is cls
        raised = error_from_answer(status, orjson.dumps(problem(code, "what went wrong", param="input")))
        assert type(raised) is cls
        assert (raised.status, raised.param, raised.detail) == (status, "input", "what went wrong")
    # An answer that is no problem document (a proxy's page) has no code to read.
    assert type(error_from_answer(502, b"<html>Bad Gateway</html>")) is APIError
    assert lmsp.client.HistoryExpired.code == "event_history_expired"
    assert lmsp.client.Overloaded.code == "overloaded"


def test_retry_decisions():
    attempts = Attempts(Retry(attempts=3, backoff=0.1, max_backoff=0.3))
    assert attempts.after_status(400, None) is None and attempts.after_status(500, None) is None
    assert [attempts.after_status(s, None) for s in (409, 429, 503)] == [0.1, 0.2, 0.3]
    assert attempts.after_status(503, None) is None  # the fourth: given up
    attempts.progressed()
    assert attempts.after_status(429, 2.0) == 2.0  # the service's Retry-After, not the backoff
    assert retry_after_seconds("3") == 3.0 and retry_after_seconds("soon") is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
