"""The access log's escaping on its own (lmsp/observability/accesslog.py): no control character
is written raw, nothing else changes, and every backslash written starts an escape."""

from __future__ import annotations

import re
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from lmsp.observability.accesslog import escape

_BIDI = set("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _unsafe(char: str) -> bool:
    return unicodedata.category(char) in ("Cc", "Zl", "Zp", "Cs") or char in _BIDI or char == "\\"


@given(st.text())
def test_escape_leaves_no_control_and_changes_nothing_else(text):
    escaped = escape(text)
    assert not any(_unsafe(c) and c != "\\" for c in escaped)
    if not any(_unsafe(c) for c in text):
        assert escaped == text
    # Unambiguous: every backslash written starts an escape (\\, \xNN or \uNNNN).
    assert re.fullmatch(r"(?:[^\\]|\\\\|\\x[0-9a-f]{2}|\\u[0-9a-f]{4})*", escaped, re.DOTALL)
