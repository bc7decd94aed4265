"""Threads pqloader starts, wound down before the interpreter finalizes.

Worker and read-ahead threads are daemon threads, so an iterator left open (``it =
iter(loader)``, then ``sys.exit``) cannot keep the process alive. But a daemon thread still
inside a call that released the GIL (a torch op in a transform, a pyarrow read) when the
interpreter finalizes is ended by ``pthread_exit`` through C++ frames, and the process aborts
("terminate called without an active exception", exit status 134). At exit, pqloader closes
what is still open and gives its threads a bounded time to return first.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
import weakref
from typing import Any, Protocol

EXIT_WAIT_S = 5.0  # at most, for all threads together: a hung read must not hang the exit


class _Closable(Protocol):
    def close(self) -> Any: ...


_threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_open: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()


def _forked() -> None:
    """A forked child (a torch worker) has none of its parent's threads, and must not inherit
    a lock that another parent thread held at the fork."""
    global _lock, _threads, _open
    _lock, _threads, _open = threading.Lock(), weakref.WeakSet(), weakref.WeakSet()


os.register_at_fork(after_in_child=_forked)


def track(thread: threading.Thread) -> threading.Thread:
    """Wait for ``thread`` (bounded) at exit."""
    with _lock:
        _threads.add(thread)
    return thread


def close_at_exit(obj: _Closable) -> None:
    """Call ``obj.close()`` at exit if it is still alive then (held weakly)."""
    with _lock:
        _open.add(obj)


@atexit.register
def _wind_down() -> None:
    with _lock:
        closables, threads = list(_open), list(_threads)
    for obj in closables:  # threads stop taking work
        with contextlib.suppress(Exception):  # at exit, nothing is left to report it to
            obj.close()
    end = time.monotonic() + EXIT_WAIT_S
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join(max(0.0, end - time.monotonic()))
