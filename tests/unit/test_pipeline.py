"""A worker's stages (``_pipeline``): reading windows ahead, on synthetic loads."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from pqloader._pipeline import read_ahead


@pytest.mark.parametrize("ahead", [1, 2, 3])
def test_read_ahead_keeps_the_order_and_bounds_the_loads_in_flight(ahead: int) -> None:
    lock = threading.Lock()
    started: list[int] = []

    def load(segment: Any) -> Any:
        with lock:
            started.append(segment)
        time.sleep(0.002 * (segment % 3))  # loads finish out of order
        return segment

    consumed = []
    for window in read_ahead(load, list(range(20)), ahead=ahead):
        time.sleep(0.01)  # the loads ahead have time to start
        with lock:
            assert len(started) <= window + 1 + ahead  # the one consumed, and `ahead` more
        consumed.append(window)
    assert consumed == list(range(20))


def test_read_ahead_stops_loading_when_closed() -> None:
    started: list[int] = []

    def load(segment: Any) -> Any:
        started.append(segment)
        return segment

    it = read_ahead(load, list(range(100)), ahead=2)
    assert next(it) == 0
    it.close()
    time.sleep(0.05)
    assert len(started) <= 3
