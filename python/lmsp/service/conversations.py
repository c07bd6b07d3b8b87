"""Stored conversations (R6.1-5..7, R6.2-6): keeping finished responses and reading them back.

State lives in the store, never in a connection (R6.1-7): a continuation can come on any
connection, from any client, after a restart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..protocol.errors import ProblemError
from ..store import StoredResponse, StoreWorker

__all__ = ["Conversations"]


class Conversations:
    def __init__(self, store: StoreWorker) -> None:
        self.store = store

    async def history(self, owner: str, previous_response_id: str) -> list[dict[str, Any]]:
        """The items a continuation starts from: the stored response's input, then its output."""
        stored = await self.store.get_response(owner, previous_response_id)
        if stored is None:
            raise ProblemError(
                "response_not_found",
                f"no stored response {previous_response_id!r} (was it created with store: true?)",
                param="previous_response_id",
            )
        return [*stored.input, *stored.response["output"]]

    async def keep(self, owner: str, response: dict[str, Any], items: Sequence[Mapping[str, Any]]) -> None:
        await self.store.put_response(owner, StoredResponse(response=response, input=[dict(i) for i in items]))

    async def get(self, owner: str, response_id: str) -> dict[str, Any]:
        return (await self._stored(owner, response_id)).response

    async def input_items(self, owner: str, response_id: str) -> list[dict[str, Any]]:
        return (await self._stored(owner, response_id)).input

    async def delete(self, owner: str, response_id: str) -> None:
        if not await self.store.delete_response(owner, response_id):
            raise ProblemError("response_not_found", f"no stored response {response_id!r}")

    async def _stored(self, owner: str, response_id: str) -> StoredResponse:
        stored = await self.store.get_response(owner, response_id)
        if stored is None:
            raise ProblemError("response_not_found", f"no stored response {response_id!r}")
        return stored
