"""The sampling controls a request may set, checked once for every face.

LMSP and `/v1/responses` carry them in `extensions` (a free object: the schema cannot check
them, so this does, naming `extensions.<name>`); Chat Completions as top-level fields in the
names llama-server and vLLM accept, checked by its schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..engine.sampling import Sampling
from ..protocol.errors import ProblemError

__all__ = ["CACHE_SALT_MAX", "SAMPLING_EXTENSIONS", "TOP_K_MAX", "cache_salt_of", "sampling_of", "seed_of"]

# Characters a `cache_salt` may have: a tenant's or a user's id, hashed or not, fits.
CACHE_SALT_MAX = 256

# llama-server's bound, on every face (Chat Completions and Anthropic declare it in their
# schemas): past it the value means nothing more, as no vocabulary is that large.
TOP_K_MAX = 1_000_000

# name → (lowest, highest, whole numbers only); the ranges llama-server accepts.
SAMPLING_EXTENSIONS: dict[str, tuple[float, float, bool]] = {
    "top_p": (0.0, 1.0, False),
    "top_k": (0, TOP_K_MAX, True),
    "min_p": (0.0, 1.0, False),
    "repeat_penalty": (0.0, 10.0, False),
    "presence_penalty": (-2.0, 2.0, False),
    "frequency_penalty": (-2.0, 2.0, False),
}


def _number(value: Any, name: str, param: str) -> float | int:
    low, high, whole = SAMPLING_EXTENSIONS[name]
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not is_number or (whole and not isinstance(value, int)) or not low <= value <= high:
        kind = "an integer" if whole else "a number"
        raise ProblemError("invalid_request", f"{param} is {kind} from {low:g} to {high:g}", param=param)
    return int(value) if whole else float(value)


def seed_of(value: Any) -> int:
    """A seed makes sampling repeatable; one out of range is ignored, as unknown extensions
    are (R6.1-8), and sampling is then random."""
    valid = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32
    return value if valid else -1


def sampling_of(base: Sampling, controls: Mapping[str, Any]) -> Sampling:
    """`base` with the controls named in `controls` (other keys are not this module's)."""
    chosen: dict[str, Any] = {
        name: _number(value, name, f"extensions.{name}")
        for name, value in controls.items()
        if name in SAMPLING_EXTENSIONS and value is not None
    }
    if "seed" in controls:
        chosen["seed"] = seed_of(controls["seed"])
    return replace(base, **chosen)


def cache_salt_of(value: Any, param: str) -> str | None:
    """A request's `cache_salt` (vLLM's name): cached prompt cells are reused only by requests
    that send the same one (and are of the same owner). None when absent."""
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= CACHE_SALT_MAX:
        raise ProblemError("invalid_request", f"{param} is a string of 1 to {CACHE_SALT_MAX} characters", param=param)
    return value


def narrowing_of(extensions: Mapping[str, Any]) -> bool:
    """`extensions.schema_narrowing`: False turns the service's schema narrowing off for this
    request (engine/schema_check.py, `relax`); absent or None keeps it."""
    value = extensions.get("schema_narrowing")
    if value is None:
        return True
    if not isinstance(value, bool):
        raise ProblemError(
            "invalid_request", "extensions.schema_narrowing is a boolean", param="extensions.schema_narrowing"
        )
    return value
