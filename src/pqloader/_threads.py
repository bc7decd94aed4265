"""Threads pqloader starts: daemon threads, wound down before the interpreter finalizes.

Worker and read-ahead threads are daemon threads, so an iterator left open (``it =
iter(loader)``, then ``sys.exit``) cannot keep the process alive; a ``ThreadPoolExecutor``
would (the interpreter joins its threads at exit, and a read that never returns, or one
waiting for memory room under an abandoned iterator, never ends). But a daemon thread still
inside a call that released the GIL (a torch op in a transform, a pyarrow read) when the
interpreter finalizes is ended by ``pthread_exit`` through C++ frames, and the process aborts
("terminate called without an active exception", exit status 134). At exit, pqloader closes
what is still open and gives its threads a bounded time to return first: 5 s, or twice the
longest batch a worker thread has taken to make (a heavy transform: one of 7 s aborted the
exit), at most a minute, saying so when it waits past 5 s.

A fork waits for pqloader's threads to be out of the allocator's thread set-up and tear-down
(``_forks``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from ._forks import leaving, started

T = TypeVar("T")

EXIT_WAIT_S = 5.0  # at most, for all threads together: a hung read must not hang the exit
EXIT_MOST_S = 60.0  # ... unless batches take long to make: twice the longest, up to this
_longest_s = 0.0  # the longest a worker thread took to make a batch, in this process


class _Closable(Protocol):
    def close(self) -> Any: ...


EXITING = threading.Event()  # set when the interpreter exits: work not yet begun is skipped
_threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_open: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()


def _forked() -> None:
    """A forked child (a torch worker) has none of its parent's threads, and must not inherit
    a lock that another parent thread held at the fork."""
    global _lock, _threads, _open
    _lock, _threads, _open = threading.Lock(), weakref.WeakSet(), weakref.WeakSet()


os.register_at_fork(after_in_child=_forked)


def thread(target: Callable[..., Any], name: str, *args: Any) -> threading.Thread:
    """A daemon thread of pqloader's (not started): ``target(*args)``, its start and end
    known to a fork (``_forks``)."""
    def run() -> None:
        started()
        try:
            target(*args)
        finally:
            leaving()

    return threading.Thread(target=run, daemon=True, name=name)


def executor(workers: int, name: str) -> ThreadPoolExecutor:
    """A ``ThreadPoolExecutor`` whose threads' start is known to a fork (``_forks``)."""
    return ThreadPoolExecutor(workers, thread_name_prefix=name, initializer=started)


def track(thread: threading.Thread) -> threading.Thread:
    """Wait for ``thread`` (bounded) at exit."""
    with _lock:
        _threads.add(thread)
    return thread


def took(seconds: float) -> None:
    """A worker thread made a batch in ``seconds``: the exit waits longer for the next."""
    global _longest_s
    _longest_s = max(_longest_s, seconds)  # (a race loses at most one measure)


def close_at_exit(obj: _Closable) -> None:
    """Call ``obj.close()`` at exit if it is still alive then (held weakly)."""
    with _lock:
        _open.add(obj)


@atexit.register
def _wind_down() -> None:
    EXITING.set()
    with _lock:
        closables, threads = list(_open), list(_threads)
    for obj in closables:  # threads stop taking work
        with contextlib.suppress(Exception):  # at exit, nothing is left to report it to
            obj.close()
    threads = [t for t in threads if t is not threading.current_thread()]
    began = time.monotonic()
    _join(threads, began + EXIT_WAIT_S)
    patience = min(EXIT_MOST_S, 2 * _longest_s + 1)
    alive = [t for t in threads if t.is_alive()]
    if alive and patience > EXIT_WAIT_S:
        with contextlib.suppress(Exception):
            print(f"pqloader: at exit, waiting up to {patience - EXIT_WAIT_S:.0f} s more for "
                  f"{len(alive)} worker thread(s) to finish their batch (batches took up to "
                  f"{_longest_s:.1f} s to make; a thread ended inside a torch or pyarrow call "
                  "aborts the process)", file=sys.stderr, flush=True)
        _join(alive, began + patience)


def _join(threads: list[threading.Thread], deadline: float) -> None:
    for thread in threads:
        if thread.ident is not None:  # one tracked but not started (interrupted): no join
            thread.join(max(0.0, deadline - time.monotonic()))


class DaemonPool:
    """At most ``size`` daemon threads running submitted calls, started as needed and kept
    until :meth:`shutdown` (a thread per call instead kept more memory: each new thread gets
    fresh allocator caches, measured +10% peak RSS under ``memory_budget_bytes``)."""

    def __init__(self, size: int, name: str) -> None:
        self._size, self._name = size, name
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        close_at_exit(self)  # idle threads end at once then, not after the exit's wait

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        future: Future[T] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)

        if len(self._threads) < self._size:
            worker = thread(self._work, f"{self._name}-{len(self._threads)}")
            self._threads.append(track(worker))
            worker.start()
        self._tasks.put(run)
        return future

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            task()
            del task  # its closure holds the result until the next task otherwise

    def shutdown(self) -> None:
        """Threads end once their current call returns; none is waited for."""
        for _ in self._threads:
            self._tasks.put(None)

    close = shutdown
