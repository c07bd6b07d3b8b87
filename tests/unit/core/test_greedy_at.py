"""`_core._greedy_at` on rows made here: ties go to the lowest id, NaN never wins, and an
address that cannot be a row is refused. (On the real model's rows: tests/e2e/test_greedy.py.)"""

from __future__ import annotations

import array

import pytest

from lmsp._core import _greedy_at


def _row(values: list[float]) -> tuple[array.array, int]:
    row = array.array("f", values)
    return row, row.buffer_info()[0]


def test_ties_go_to_the_lowest_id_and_nan_never_wins():
    row, address = _row([0.5, 2.0, -1.0, 2.0, 1.0])
    assert _greedy_at(address, len(row)) == 1
    row, address = _row([float("nan"), 0.1, float("nan"), 0.3])
    assert _greedy_at(address, len(row)) == 3
    row, address = _row([float("-inf"), float("-inf")])
    assert _greedy_at(address, len(row)) == 0


@pytest.mark.parametrize("address, n", [(0, 4), (3, 4), (None, 0)])
def test_an_address_that_cannot_be_a_row_is_refused(address, n):
    row, start = _row([1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError, match="logits"):
        _greedy_at(start if address is None else address, n)
