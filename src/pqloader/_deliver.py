"""Thread delivery: a pool of threads advancing a rank's worker streams, batches in plan order.

A rank's plan deals its batches round-robin to ``S`` worker *streams* (batch ``k`` is made by
stream ``k % S``; the order depends on ``S``, never on how many threads run). Here any number of
threads, from none to ``S``, advance those streams: each free thread takes the free stream whose
next batch is due first, as long as it lies within ``depth`` batches of the consumer. When
``caller_helps``, the caller, while it waits for batch ``k`` that no thread has taken, makes it
itself (so zero threads is the caller alone). So the number of active
threads can change at any batch (the autotuner does) without changing a single batch.

``_shared.SharedStream`` makes ``S`` such streams out of one (``num_workers="auto"``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ._config import START_GRACE_S
from ._errors import LoaderTimeoutError
from ._globalrng import call_init
from ._memory import MemoryBudget, nbytes
from ._threads import close_at_exit, thread, took, track

_SIZED = 8  # under a budget, the first batches are sized, then one in this many (~5% of a
# loader's rate on string columns, every batch sized)
_POLL_S = 0.1  # how often blocked threads look at the stop flag and at dead peers

Item = tuple[str, Any]  # ("batch", batch) or ("error", exception)


class Delivery:
    """Batches ``start .. stop - 1`` of a rank, made by ``streams[k % len(streams)]``.

    Args:
        streams: stream ``s`` yields batches ``k >= start`` with ``k % S == s``, in order.
        start, stop: the batches to deliver.
        depth: most batches made or being made ahead of the one the caller waits for.
        threads: how many threads may advance streams now (``set_threads`` changes it).
        caller_helps: let the caller make a batch it waits for that no thread has taken.
            Without it every batch is made in a thread (worker_init_fn ran there), and
            ``threads`` must stay above 0.
        max_threads: threads started (those above ``threads`` wait).
        finish: applied to each batch in the thread that made it (pinning).
        worker_init_fn: called in each thread, with its index, before its first batch.
        timeout_s: seconds the caller waits for a batch before :class:`LoaderTimeoutError`
            (0: forever), counted once every thread's ``worker_init_fn`` has returned (those
            may take ``START_GRACE_S`` more).
        where: describes the rank and epoch in error notes.
        memory: the loader's memory budget: a batch is made ahead of the caller's only while
            the largest made so far fits in it (the one the caller waits for is made anyway:
            the least that progresses), and reads ahead leave room for ``depth`` of them.
    """

    def __init__(self, streams: Sequence[Iterator[Any]], *, start: int, stop: int, depth: int,
                 threads: int, max_threads: int, finish: Callable[[Any], Any],
                 caller_helps: bool = False,
                 worker_init_fn: Callable[[int], Any] | None = None, timeout_s: float = 0.0,
                 where: str = "", memory: MemoryBudget | None = None) -> None:
        self._streams = list(streams)
        n = len(self._streams)
        self._next = [start + (s - start) % n for s in range(n)]  # each stream's next batch
        self._busy = [False] * n
        self._done: dict[int, Item] = {}
        self._stop = stop
        self._depth = max(1, depth)
        self._waiting_for = start  # the batch the caller wants next
        self._threads_wanted = max(0, min(threads, max_threads))
        self._finish = finish
        self._caller_helps = caller_helps
        self._init = worker_init_fn
        self._timeout_s = timeout_s
        self._where = where
        self._memory = memory
        self._largest = 0  # bytes of the largest batch made so far (counted with a budget)
        # One lock, three queues of waiters, so that a change wakes only who it concerns
        # (a notify_all on one condition woke every thread and the caller). Measured within
        # noise on W2 with 2 threads: most context switches there are GIL hand-offs.
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # active threads with nothing to claim
        self._parked = threading.Condition(self._lock)  # threads above the wanted count
        self._ready = threading.Condition(self._lock)  # the caller, for its batch
        self._closed = False
        self._caller_waits = False  # in get(), on _ready: a batch made notifies it
        self._fatal: BaseException | None = None  # a worker_init_fn's error, for the caller
        self._born = time.perf_counter()
        self._starting = max(0, max_threads) if worker_init_fn is not None else 0
        self._up_at = self._born  # when the last worker_init_fn returned
        self._pool = [track(thread(self._run, f"pqloader-worker-{i}", i))
                      for i in range(max(0, max_threads))]
        close_at_exit(self)  # an iterator left open at exit: its threads wind down first
        for t in self._pool:
            t.start()

    # -- control ----------------------------------------------------------------------------
    def set_threads(self, threads: int) -> None:
        """Let ``threads`` of the started threads advance streams (0: the caller alone)."""
        with self._lock:
            wanted = max(0, min(threads, len(self._pool)))
            if wanted != self._threads_wanted:
                self._threads_wanted = wanted
                self._wake_all()

    def close(self) -> None:
        """Stop the threads; streams no thread is advancing are closed now (their read-ahead
        stops), the others when their thread returns."""
        with self._lock:
            self._closed = True
            self._wake_all()
            idle = [s for s, busy in enumerate(self._busy) if not busy]
        for t in self._pool:
            t.join(timeout=2 * _POLL_S)
        for s in idle:
            self._streams[s].close()  # type: ignore[attr-defined]

    def _wake_all(self) -> None:
        """Every waiter looks again (lock held): the thread count changed, or closing."""
        self._work.notify_all()
        self._parked.notify_all()
        self._ready.notify_all()

    def _offer(self) -> None:
        """Wake one waiting thread if a stream can be claimed (lock held). None may while
        none is wanted (the tuner's 0: the caller makes each batch, and this cost ~2 us of
        its ~50 at batch 64, measured)."""
        if self._threads_wanted and self._claim() is not None:
            self._work.notify()

    # -- the threads ------------------------------------------------------------------------
    def _claim(self) -> int | None:
        """The free stream whose next batch is due first and within depth (lock held)."""
        ahead = self._depth if self._memory is None or self._memory.room(self._largest) else 1
        limit = min(self._stop, self._waiting_for + ahead)
        best = None
        for s, k in enumerate(self._next):
            if not self._busy[s] and k < limit and (best is None or k < self._next[best]):
                best = s
        return best

    def _make(self, s: int) -> None:
        """Advance stream ``s`` by one batch (lock not held) and post it."""
        k = self._next[s]
        began = time.perf_counter()
        try:
            batch = self._finish(next(self._streams[s]))
            took(time.perf_counter() - began)
            if self._memory is not None and (k < _SIZED or k % _SIZED == 0) \
                    and (size := nbytes(batch)) > self._largest:
                self._largest = size
                self._memory.batches_ahead = size * self._depth
            item: Item = ("batch", batch)
            del batch
        except StopIteration:
            item = ("error", RuntimeError(f"pqloader worker stream {s} ended before batch {k}; "
                                          "this is a bug in pqloader, please report it"))
        except BaseException as exc:  # handed to the caller, who re-raises it
            exc.add_note(f"in pqloader worker {s} ({self._where})")
            item = ("error", exc)
        with self._lock:
            self._done[k] = item
            self._next[s] = k + len(self._streams)
            self._busy[s] = False
            if k == self._waiting_for and self._caller_waits:
                self._ready.notify()
            self._offer()  # the stream is free again, or the next is due: for an idle thread
            closed = self._closed
        del item  # an error's traceback holds this frame: no cycle keeping the loader alive
        if closed:  # close() skipped this stream while it was busy
            self._streams[s].close()  # type: ignore[attr-defined]

    def _run(self, index: int) -> None:
        try:
            if self._init is not None:
                call_init(self._init, index)
        except BaseException as exc:
            exc.add_note(f"in worker_init_fn({index}) of pqloader worker thread {index}")
            with self._lock:
                self._fatal = self._fatal or exc
                self._ready.notify()
            return
        finally:
            if self._init is not None:
                with self._lock:
                    self._starting -= 1
                    self._up_at = time.perf_counter()
        while True:
            with self._lock:
                while True:
                    if self._closed:
                        return
                    if index >= self._threads_wanted:
                        self._parked.wait(_POLL_S)
                        continue
                    s = self._claim()
                    if s is not None:
                        self._busy[s] = True
                        break
                    self._work.wait(_POLL_S)
                    if index >= self._threads_wanted:
                        self._offer()  # a wake-up meant for an active thread: pass it on
            self._make(s)

    # -- the caller -------------------------------------------------------------------------
    def get(self, k: int) -> Any:
        """Batch ``k`` (asked for in order), made by a thread or, if none took it, here."""
        began = time.perf_counter()
        with self._lock:
            if self._fatal is not None:  # whenever it came: other threads may make every batch
                raise self._fatal
            if k != self._waiting_for:
                self._waiting_for = k
                self._offer()
            while k not in self._done:
                if self._fatal is not None:
                    raise self._fatal
                s = k % len(self._streams)
                if self._caller_helps and not self._busy[s] and self._next[s] == k:
                    self._busy[s] = True
                    self._lock.release()
                    try:
                        self._make(s)
                    finally:
                        self._lock.acquire()
                    continue
                if not any(t.is_alive() for t in self._pool) and not self._busy[s]:
                    raise RuntimeError(f"pqloader worker threads died before batch {k} "
                                       f"({self._where})")
                self._caller_waits = True
                self._ready.wait(_POLL_S)
                self._caller_waits = False
                if self._timeout_s and k not in self._done:
                    self._check_time(k, began)
            kind, value = self._done.pop(k)
            self._waiting_for = k + 1
            self._offer()  # one more batch may be made ahead
        if kind == "error":
            try:
                raise value
            finally:  # its traceback holds this frame: no cycle keeping the loader alive
                del value
        return value

    def _check_time(self, k: int, began: float) -> None:
        """Raise if batch ``k``, asked for at ``began``, is late (lock held)."""
        now = time.perf_counter()
        if self._starting:
            limit = START_GRACE_S + self._timeout_s
            if now - self._born >= limit:
                raise LoaderTimeoutError(
                    f"worker_init_fn had not returned in every pqloader worker thread within "
                    f"{limit:g} s ({self._where}); look for a worker_init_fn that does not "
                    "return")
        elif now - max(began, self._up_at) >= self._timeout_s:
            raise LoaderTimeoutError(
                f"no batch within timeout={self._timeout_s} s (batch {k}, {self._where}); "
                "raise timeout= or look for a slow file system or transform"
            )

    def __iter__(self) -> Iterator[Any]:
        try:
            for k in range(self._waiting_for, self._stop):
                yield self.get(k)
            self.check()
        finally:
            self.close()

    def check(self) -> None:
        """Raise a worker_init_fn's error that came after the last batch was taken."""
        with self._lock:
            if self._fatal is not None:
                raise self._fatal


class OncePerIndex:
    """``worker_init_fn`` for thread workers with ``persistent_workers=True``: threads start
    anew every pass, yet it runs once per worker index for the loader's life, as in torch's
    persistent processes. A call that failed (its error reached the caller) is made again by
    the next pass's thread, as torch would start a new process."""

    def __init__(self, init: Callable[[int], Any]) -> None:
        self._init = init
        self._done: set[int] = set()
        self._lock = threading.Lock()  # one thread per index at a time: only the set is shared

    def __call__(self, index: int) -> Any:
        with self._lock:
            if index in self._done:
                return None
        result = self._init(index)
        with self._lock:
            self._done.add(index)
        return result
