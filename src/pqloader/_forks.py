"""pqloader's threads across a fork: none is starting or ending when the fork is taken.

A thread's first allocation from Arrow's pool and its exit take a lock of the allocator's
(mimalloc, pyarrow's default: its list of thread heaps, taken only there). A fork taken
meanwhile leaves that lock held in the child for good, and the child's first new thread to
allocate waits on it forever: seen as a worker process stuck in read_row_groups'
pre-buffering, once in this project's tests and twice in 27,000 forks of a loop that broke off
a thread loader and then made a process pass. Python's ``join`` returns before the OS thread
runs its exit (thread-local destructors, mimalloc's among them): in that loop a pqloader thread
was in that window at 17 forks of 2,000.

So each pqloader thread makes its first allocation as it starts (:func:`started`), and a thread
made by ``_threads.thread`` says when it is leaving (:func:`leaving`). Before a fork,
:func:`_settle` waits until none is starting and every one that left (or ended in Python: a
``ThreadPoolExecutor``'s, which has no such hook) is gone from the OS, then holds this module's
lock until the fork is made, so that no thread starts or leaves meanwhile. At most
``FORK_WAIT_S`` a fork; a thread waited on that long is not waited for again. Threads that are
not pqloader's (pyarrow's own pools, yours) are not covered.
"""

from __future__ import annotations

import os
import threading
import time

import pyarrow as pa

FORK_WAIT_S = 0.25
_lock = threading.Lock()
_held = False  # _settle returned holding _lock: released once the fork is made
_starting: set[int] = set()  # native ids of pqloader threads making their first allocation
_leaving: set[int] = set()  # ... of those whose target returned, until gone from the OS
_ours: set[int] = set()  # ... of every pqloader thread started, until gone from the OS
_PRUNE_AT = 256  # ids of threads gone are dropped once this many are kept


def started() -> None:
    """Called first on every thread pqloader starts: its first allocation from Arrow's pool is
    made now, while no fork is being taken, not in the middle of a read."""
    tid = threading.get_native_id()
    with _lock:
        _starting.add(tid)
    try:
        _first_allocation()
    finally:
        with _lock:
            _starting.discard(tid)
            _ours.add(tid)
            if len(_ours) > _PRUNE_AT and (tasks := _tasks()) is not None:
                _ours.intersection_update(tasks)
                _leaving.intersection_update(tasks)


def leaving() -> None:
    """Called last on a pqloader thread: from here it ends, a fork waits until it has."""
    with _lock:
        _leaving.add(threading.get_native_id())


def _first_allocation() -> None:
    pa.allocate_buffer(64)  # 0 bytes would not reach the allocator


def _tasks() -> set[int] | None:
    """The native ids of this process's threads (Linux), else None."""
    try:
        return {int(name) for name in os.listdir("/proc/self/task")}
    except (OSError, ValueError):
        return None


def _settle() -> None:
    """Before a fork: wait as the module docstring says, and return holding the lock."""
    global _held
    deadline = time.monotonic() + FORK_WAIT_S
    while (tasks := _tasks()) is not None:
        alive = {t.native_id for t in threading.enumerate()}
        # bounded: this very thread may hold it (a signal handler that forks, found in review)
        if not _lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return
        _ours.intersection_update(tasks)
        _leaving.intersection_update(tasks)
        waiting = _starting | _leaving | (_ours - alive)
        if not waiting or time.monotonic() >= deadline:
            # stuck in its start or exit: not waited for again
            _ours.difference_update(waiting)
            _leaving.difference_update(waiting)
            _starting.difference_update(waiting)
            _held = True
            return
        _lock.release()
        time.sleep(0.0002)


def _parent() -> None:
    global _held
    if _held:
        _held = False
        _lock.release()


def _child() -> None:
    """A forked child (a torch worker) has none of its parent's threads, and must not inherit
    the lock its parent held across the fork."""
    global _lock, _held, _starting, _leaving, _ours
    _lock, _held = threading.Lock(), False
    _starting, _leaving, _ours = set(), set(), set()


os.register_at_fork(before=_settle, after_in_parent=_parent, after_in_child=_child)
