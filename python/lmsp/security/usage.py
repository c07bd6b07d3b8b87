"""What each token used, reported from this process's counts (security/quota.py) to the token
store every few seconds and once more when the service stops, where `lmsp token list` reads it
and every replica's reports add up."""

from __future__ import annotations

import asyncio
import logging

from ..tokens import Tokens
from .quota import Limiter

__all__ = ["REPORT_EVERY_S", "report_now", "report_usage"]

log = logging.getLogger(__name__)

# Seconds between reports: what `lmsp token list` may lag behind the service.
REPORT_EVERY_S = 5.0


async def report_now(limiter: Limiter, tokens: Tokens) -> None:
    """Writes the counts since the last report (off the event loop: a database write); kept
    for the next one when the store cannot take them now."""
    used = limiter.take_unreported()
    if not used:
        return
    try:
        await asyncio.to_thread(tokens.add_usage, used)
    except Exception as exc:  # the store away (a PostgreSQL restart, a locked file): not the requests' problem
        log.warning("tokens: could not write their usage (%s); kept for the next report", exc)
        limiter.give_back(used)


async def report_usage(limiter: Limiter, tokens: Tokens, every: float = REPORT_EVERY_S) -> None:
    """Reports every `every` seconds until cancelled."""
    while True:
        await asyncio.sleep(every)
        await report_now(limiter, tokens)
