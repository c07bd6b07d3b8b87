"""The sampling controls a request may set, checked once for every face.

LMSP and `/v1/responses` carry them in `extensions` (a free object: the schema cannot check
them, so this does); Chat Completions as top-level fields, checked by its schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..engine.sampling import Sampling

__all__ = ["sampling_of", "seed_of"]


def seed_of(value: Any) -> int:
    """A seed makes sampling repeatable; one out of range is ignored, as unknown extensions
    are (R6.1-8), and sampling is then random."""
    valid = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32
    return value if valid else -1


def sampling_of(base: Sampling, controls: Mapping[str, Any]) -> Sampling:
    """`base` with the controls named in `controls` (other keys are not this module's)."""
    if "seed" in controls:
        return replace(base, seed=seed_of(controls["seed"]))
    return base
