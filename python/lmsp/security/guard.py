"""Who is asking (§10): a bearer token's record, or, with no tokens, a loopback client.

Tokens configured (any active one in the data folder, or in the shared store): every request needs
`Authorization: Bearer <token>` (or `X-Api-Key: <token>`, as Anthropic's clients send it);
missing or unknown: 401 with `WWW-Authenticate` (RFC 6750).
No tokens: loopback clients get every scope, provided `Host` is a loopback name (DNS
rebinding); a token such a client sends anyway is ignored (SDKs send placeholder keys).

Tokenless mode is decided when the service starts, and left once, for good: a token created
while it runs secures it at once, but revoking every token does not open it again (a revoke
meant to shut someone out must not let everyone in). Restart the service to run it tokenless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..protocol.errors import ProblemError
from ..protocol.owners import LOCAL_OWNER
from ..tokens import NO_QUOTA, Quota, Tokens
from .hosts import client_address, is_loopback_address, is_loopback_host_header
from .scopes import SCOPES

__all__ = ["LOCAL", "Guard", "Principal"]

_REALM = 'Bearer realm="lmsp"'


@dataclass(frozen=True)
class Principal:
    owner: str  # whose stored responses and tasks a request may see
    scopes: frozenset[str]
    token_id: str | None  # None: a loopback client of a service without tokens
    quota: Quota = NO_QUOTA  # the token's (security/quota.py); the local client has none


LOCAL = Principal(LOCAL_OWNER, frozenset(SCOPES), None)


def _challenge(error: str | None = None, **attrs: str) -> list[tuple[str, str]]:
    # RFC 6750 §3: no error attribute when the request carried no credentials at all.
    parts = [_REALM] + ([f'error="{error}"'] if error else []) + [f'{k}="{v}"' for k, v in attrs.items()]
    return [("www-authenticate", ", ".join(parts))]


class Guard:
    def __init__(self, tokens: Tokens | None) -> None:
        self.tokens = tokens
        # Decided now, and latched: once a token was active, tokens are needed until a restart.
        self._secured = tokens is not None and tokens.any_active()

    def local(self) -> bool:
        """No token has been active since the service started: it runs on the local defaults."""
        # Asked every time even when latched: it rereads a changed store, which `authenticate`
        # (called with fresh=True after this) counts on to see a revoke.
        if self.tokens is not None and self.tokens.any_active():
            self._secured = True
        return not self._secured

    def principal(self, scope: Any, host: str | None) -> Principal:
        """Who sent the request; `host` is the one it is for (`request_host`)."""
        headers = scope.headers
        if self.local():
            return self._local(scope, host)
        values = [v for k, v in headers.items() if k == "authorization"]
        if len(values) > 1:
            raise ProblemError(
                "invalid_request",
                "send one Authorization header",
                param="Authorization",
                headers=_challenge("invalid_request"),
            )
        if not values and "authorization" not in headers and "x-api-key" in headers:
            # Anthropic's SDKs (and Claude Code given ANTHROPIC_API_KEY) send the token so.
            return self._api_key(headers)
        if not values:
            if "authorization" in headers:  # present, but granian could not decode it
                raise _invalid("the token is not valid")
            raise ProblemError(
                "authentication_required",
                "this service needs `Authorization: Bearer <token>`",
                param="Authorization",
                headers=_challenge(),
            )
        scheme, _, token = values[0].strip().partition(" ")
        if scheme.lower() != "bearer":
            raise ProblemError(
                "authentication_required",
                "only Bearer tokens are accepted",
                param="Authorization",
                headers=_challenge(),
            )
        assert self.tokens is not None  # local() above said there are tokens
        info = self.tokens.authenticate(token.strip(), fresh=True)  # local() above read the tokens
        if info is None:
            raise _invalid("the token is unknown or revoked")
        return Principal(info.owner, info.scopes, info.id, info.quota)

    def _api_key(self, headers: Any) -> Principal:
        """A token in `X-Api-Key`, checked as a Bearer one is."""
        values = [v for k, v in headers.items() if k == "x-api-key"]
        if len(values) != 1:
            raise ProblemError(
                "invalid_request", "send one X-Api-Key header", param="X-Api-Key", headers=_challenge("invalid_request")
            )
        assert self.tokens is not None  # not local: there are tokens
        info = self.tokens.authenticate(values[0].strip(), fresh=True)
        if info is None:
            raise _invalid("the token is unknown or revoked")
        return Principal(info.owner, info.scopes, info.id, info.quota)

    @staticmethod
    def _local(scope: Any, host: str | None) -> Principal:
        if not is_loopback_address(client_address(scope.client)):
            raise ProblemError(
                "authentication_required",
                "this service has no tokens, so it serves clients on this machine only",
                param="Authorization",
                headers=_challenge(),
            )
        if not is_loopback_host_header(host):
            raise ProblemError(
                "host_not_allowed",
                f"Host {host!r} is not a loopback name (localhost, 127.0.0.1, [::1]); a service without "
                "tokens answers only those, so that no web page can reach it through DNS rebinding",
                param="Host",
            )
        return LOCAL

    @staticmethod
    def require(principal: Principal, needed: str, param: str = "Authorization") -> None:
        """403 naming the scope (also machine-readable: `WWW-Authenticate: … scope="…"`)."""
        if needed not in principal.scopes:
            raise ProblemError(
                "insufficient_scope",
                f"this needs the {needed!r} scope, which the token lacks",
                param=param,
                headers=_challenge("insufficient_scope", scope=needed),
            )


def _invalid(detail: str) -> ProblemError:
    return ProblemError(
        "invalid_token", detail, param="Authorization", headers=_challenge("invalid_token", error_description=detail)
    )
