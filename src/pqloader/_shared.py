"""One stream made by several threads (``num_workers="auto"``).

:class:`SharedStream` makes the ``S`` streams of :class:`pqloader._deliver.Delivery` out of
one: its batches are cut in order under a lock and finished (collated, transformed) by
whichever thread asked.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any


class SharedStream:
    """One stream's batches for several threads: cut in order under a lock, finished outside it.

    ``num_workers="auto"`` plans one stream, so its batches are those of ``num_workers=0``
    whatever the tuner does. :meth:`streams` deals them to ``n`` views for :class:`Delivery`
    (view ``s`` makes the batches ``k % n == s``): a thread asking for batch ``k`` cuts every
    batch before it that is not cut yet (cheap: slices of the permuted window), keeps those
    for the views they belong to, and collates and transforms ``k`` (the costly part) without
    the lock, beside the other threads.

    Args:
        raw: the stream's cut batches, from batch ``start`` on.
        finish: makes a cut batch what the user sees.
    """

    def __init__(self, raw: Iterator[Any], *, start: int, finish: Callable[[Any], Any]) -> None:
        self._raw = raw
        self._finish = finish
        self._lock = threading.Lock()
        self._cut: dict[int, Any] = {}  # cut, not yet taken
        self._next = start  # the next batch to cut
        self._error: tuple[int, BaseException] | None = None
        self._closed = False

    def _take(self, k: int) -> Any:
        try:
            with self._lock:
                while k not in self._cut and self._error is None:
                    try:
                        self._cut[self._next] = next(self._raw)
                    except StopIteration:
                        self._error = (self._next, RuntimeError(
                            f"pqloader's stream ended before batch {self._next}; this is a bug "
                            "in pqloader, please report it"))
                    except BaseException as error:
                        self._error = (self._next, error)
                    else:
                        self._next += 1
                if k in self._cut:
                    return self._cut.pop(k)
                assert self._error is not None
                failed, exc = self._error
                if k == failed:
                    raise exc
                raise RuntimeError(f"pqloader batch {failed} failed before this one") from exc
        finally:
            self._close_if_closed()  # after the release: close() may have found the lock held

    def _view(self, first: int, stop: int, step: int) -> Iterator[Any]:
        for k in range(first, stop, step):
            yield self._finish(self._take(k))

    def streams(self, n: int, stop: int) -> list[Iterator[Any]]:
        """``n`` views for :class:`Delivery` over batches ``start .. stop - 1``."""
        start = self._next
        return [self._view(start + (s - start) % n, stop, n) for s in range(n)]

    def _close_raw(self) -> None:
        close = getattr(self._raw, "close", None)
        if close is not None:
            close()
        self._cut.clear()

    def close(self) -> None:
        """Stop reading ahead. A thread cutting now closes the stream when it is done."""
        self._closed = True
        self._close_if_closed()

    def _close_if_closed(self) -> None:
        """Close the stream if closing was asked and no thread holds it. Whoever releases the
        lock last after ``close()`` sets the flag sees it here, so one of them closes."""
        if self._closed and self._lock.acquire(blocking=False):
            try:
                self._close_raw()
            finally:
                self._lock.release()
