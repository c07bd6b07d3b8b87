"""A Python client for LMSP services: `Client` and `AsyncClient`, typed results, one exception
class per problem code, safe retries and task event streams that resume by themselves."""

from . import errors
from .aio import AsyncClient, AsyncResponseStream
from .errors import *  # noqa: F403 (one class per code, named in errors.__all__)
from .retry import Retry
from .sse import iter_events
from .sync import Client, ResponseStream
from .types import Event, Model, OutputItem, Response, Task, Usage

__all__ = [
    "AsyncClient",
    "AsyncResponseStream",
    "Client",
    "Event",
    "Model",
    "OutputItem",
    "Response",
    "ResponseStream",
    "Retry",
    "Task",
    "Usage",
    "iter_events",
    *errors.__all__,
]
