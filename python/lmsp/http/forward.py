"""Routing between replicas (`--advertise-url`): a request is sent on to a live, not busy
sibling and its answer passed back as it comes (a stream unbuffered) when

- its model is not loaded here and the sibling has it loaded (reason `model`): the fleet does
  not load a model twice;
- or it continues a conversation (http/affinity.py) that the sibling served last and this
  replica did not (reason `affinity`): the sibling likely holds its prompt state in memory,
  where this replica would read the conversation's whole past again (or restore it from the
  shared tier, slower than memory).

Decided by the app before any face reads or plans the request.

Each replica writes its `Residence` (events/residency.py: its URL, its models loaded or
loading, busy or not, the conversations it served last) every `BEAT_S` through the event
engine's residency, and reads its siblings' entries at the same beat; a request's decision
reads that view, never Redis.

What is sent on is the request as it came (method, path, query, body, headers: the token
too, so the sibling checks it and charges its quota), marked `lmsp-forwarded`: a sibling
never forwards a marked request again, so two replicas cannot send one back and forth. The
request is served here instead when the sibling is busy, cannot be reached within
`CONNECT_S` (killed, gone: its entry outlives it by at most its TTL), or answers 503. Once
the sibling has answered anything else, that answer is the client's, errors included.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import httpx
import orjson

from ..events.residency import MAX_KEYS, Residence, Residency
from ..observability.metrics import Metrics
from .affinity import affinity_key, response_key
from .hangup import unless_client_leaves
from .request import Request

__all__ = ["BEAT_S", "CONNECT_S", "MARKER", "SERVED_BY", "Forwarder", "json_object"]

log = logging.getLogger(__name__)

# The request header a forwarding replica adds (its replica id): never forwarded again.
MARKER = "lmsp-forwarded"
# The response header naming the replica that served an answer (a random id per start: it
# says which replica, not where it is).
SERVED_BY = "lmsp-served-by"
# How often a replica writes its entry and reads its siblings' (well inside the entry's TTL).
BEAT_S = 0.5
# How long a sibling gets to accept the connection (and take the body) before the request
# is served here: a killed replica's port refuses at once, a lost machine's times out.
CONNECT_S = 1.0
# Not passed on either way: they describe one connection, not the request (RFC 9110 §7.6.1);
# the length is the body's, set again by whoever writes it.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        MARKER,
    }
)


def json_object(body: bytes) -> dict[str, Any]:
    """A generation request's body, whichever face it is for; empty when it is not a JSON
    object (the face then answers what is wrong with it)."""
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


class Forwarder:
    def __init__(
        self,
        residency: Residency,
        url: str,
        *,
        models: Callable[[], list[str]],
        known: Callable[[str], bool],
        busy: Callable[[], bool],
        metrics: Metrics | None = None,
        beat: float = BEAT_S,
    ) -> None:
        """`url`: where siblings reach this replica; `models`: the models loaded or loading
        here; `known`: whether this replica serves a model id at all; `busy`: draining, or a
        queue full."""
        self.replica = uuid.uuid4().hex[:16]
        self.url = url.rstrip("/")
        self._residency = residency
        self._models = models
        self._known = known
        self._busy = busy
        self._metrics = metrics
        self._beat_s = beat
        self._view: list[Residence] = []  # the live siblings at the last beat
        # The conversations served here last (http/affinity.py), oldest first: published for
        # the siblings, and a request continuing one stays here (its state is here too).
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._beating: asyncio.Task[None] | None = None
        self._troubled = False
        # No read timeout: a sync answer's headers come only once it is generated.
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=CONNECT_S, write=CONNECT_S, pool=CONNECT_S),
            follow_redirects=False,
            trust_env=False,  # never through a proxy the environment names: siblings are direct
        )

    # --- the residency beat ------------------------------------------------------------------

    def mine(self) -> Residence:
        return Residence(self.replica, self.url, tuple(self._models()), self._busy(), tuple(self._recent))

    def served(self, key: str) -> None:
        """A conversation served here (its state now in memory here), the latest of MAX_KEYS."""
        self._recent[key] = None
        self._recent.move_to_end(key)
        if len(self._recent) > MAX_KEYS:
            self._recent.popitem(last=False)

    def produced(self, owner: str, response_id: str) -> None:
        """A stored response generated here (the service tells): its continuation comes here."""
        self.served(response_key(owner, response_id))

    async def beat(self) -> None:
        """Writes this replica's entry and reads its siblings'; on failure routes nothing until
        the next beat succeeds (a view that cannot be refreshed cannot be trusted)."""
        try:
            await self._residency.announce(self.mine())
            self._view = [e for e in await self._residency.entries() if e.replica != self.replica]
        except Exception as exc:  # Redis away or stalled: the store's loops say more
            self._view = []
            if not self._troubled:
                log.warning("replica residency: %s; serving every request here until it answers", exc)
            self._troubled = True
        else:
            self._troubled = False

    async def start(self) -> None:
        await self.beat()
        self._beating = asyncio.ensure_future(self._beat_loop())

    async def _beat_loop(self) -> None:
        while True:
            await asyncio.sleep(self._beat_s)
            await self.beat()

    async def withdraw(self) -> None:
        """Stopping: no more beats, and the entry goes now rather than at its TTL."""
        if self._beating is not None:
            self._beating.cancel()
            self._beating = None
        self._view = []
        try:
            await self._residency.withdraw(self.replica)
        except Exception as exc:  # it lapses at its TTL anyway
            log.warning("replica residency: could not withdraw: %s", exc)

    async def aclose(self) -> None:
        await self.withdraw()
        await self._client.aclose()
        await self._residency.aclose()

    # --- one request -------------------------------------------------------------------------

    def target(self, model: str, key: str | None = None) -> tuple[Residence, str] | None:
        """The sibling to send a request for `model` (continuing conversation `key`) to, and
        why (`model`, `affinity`); None to serve it here."""
        if not self._known(model):
            return None
        if model not in self._models():
            reason, holders = "model", [e for e in self._view if model in e.models]
        elif key is not None and key not in self._recent:
            # Served here last too, or by nobody: here is as good as anywhere.
            reason, holders = "affinity", [e for e in self._view if model in e.models and key in e.keys]
        else:
            return None
        ready = [e for e in holders if not e.busy]
        if holders and not ready:
            self._fell_back("busy")
        if not ready:
            return None
        # Of the siblings with the model, one that also served the conversation.
        warm = [e for e in ready if key in e.keys] if key is not None else []
        return random.choice(warm or ready), reason

    async def route(self, req: Request, base_proto: Any, max_body: int) -> bool:
        """Sends the request on when a sibling should serve it (True: answered); else False,
        with its body kept on `req` for the face, and its conversation noted as served here."""
        body = await req.body(max_body, any_type=True)
        req.prefetched = body
        parsed = json_object(body)
        model, key = parsed.get("model"), affinity_key(parsed, req.owner)
        # A request a sibling sent is served here whatever this replica's view says: two
        # replicas whose views disagree for a moment cannot send it back and forth.
        chosen = None
        if self._view and isinstance(model, str) and req.header(MARKER) is None:
            chosen = self.target(model, key)
        if chosen is not None:
            target, reason = chosen
            if await unless_client_leaves(base_proto, self._send(target, reason, req, base_proto, body)):
                return True
        if key is not None:
            self.served(key)
        return False

    async def _send(self, target: Residence, reason: str, req: Request, proto: Any, body: bytes) -> bool:
        scope = req.scope
        url = target.url + scope.path + (f"?{scope.query_string}" if scope.query_string else "")
        # Host included: the sibling checks it and the Origin as this replica would have.
        headers = [(k, v) for k, v in scope.headers.items() if k not in _HOP] + [(MARKER, self.replica)]
        try:
            request = self._client.build_request(scope.method, url, headers=headers, content=body)
            response = await self._client.send(request, stream=True)
        except httpx.TimeoutException:
            self._fell_back("timeout")
            return False
        except httpx.TransportError:
            self._fell_back("unreachable")
            return False
        try:
            if response.status_code == 503:  # draining, or its model failed there: try here
                self._fell_back("refused")
                return False
            if self._metrics is not None:
                self._metrics.forwarded.labels(reason).inc()
            passed = [(k, v) for k, v in response.headers.multi_items() if k not in _HOP]
            if "content-length" in response.headers:
                proto.response_bytes(response.status_code, passed, await response.aread())
            else:  # a stream: each chunk on as it comes
                transport = proto.response_stream(response.status_code, passed)
                try:
                    async for chunk in response.aiter_raw():
                        await transport.send_bytes(chunk)
                except httpx.TransportError as exc:  # the sibling died mid-answer: so does this one
                    log.warning("forwarded answer from %s broke off: %s", target.replica, exc)
            return True
        finally:
            await response.aclose()

    def _fell_back(self, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.forward_fallbacks.labels(reason).inc()
