"""A fork waits for pqloader's threads to be out of the allocator's thread set-up and tear-down.

A thread's first allocation from Arrow's pool and its exit take a lock of mimalloc's; a fork
taken meanwhile left a worker process waiting on it forever. Python's ``join`` returns before
the OS thread has run its exit (its thread-local destructors), so these tests stretch that
window with a real destructor: a pthread key whose destructor is libc's ``usleep``, given the
microseconds to sleep as the key's value.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from pqloader import _forks, _threads

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="fork, /proc/self/task and glibc's pthread keys")


@pytest.fixture
def slow_exit() -> Iterator[Callable[[float], None]]:
    """``slow_exit(s)`` on a thread makes its exit take ``s`` seconds after Python's end."""
    libc = ctypes.CDLL(None)
    key = ctypes.c_uint()
    usleep = ctypes.cast(libc.usleep, ctypes.c_void_p)
    assert libc.pthread_key_create(ctypes.byref(key), usleep) == 0

    def stretch(seconds: float) -> None:
        assert libc.pthread_setspecific(key, ctypes.c_void_p(int(seconds * 1e6))) == 0

    yield stretch
    libc.pthread_key_delete(key)


def _present(tid: int) -> bool:
    return os.path.exists(f"/proc/self/task/{tid}")


def _fork() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _gone(tid: int, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while _present(tid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _present(tid)


def _ended_thread(how: str, body: Callable[[], None]) -> int:
    """Run ``body`` on a pqloader thread made ``how``, return its native id once Python has
    joined it."""
    tid: list[int] = []

    def run() -> None:
        tid.append(threading.get_native_id())
        body()

    if how == "thread":
        t = _threads.thread(run, "pqloader-test")
        t.start()
        t.join()
    else:
        with _threads.executor(1, "pqloader-test") as pool:
            pool.submit(run).result()
    return tid[0]


@pytest.mark.parametrize("how", ["thread", "executor"])
def test_a_fork_waits_for_a_pqloader_thread_still_leaving_the_os(
        how: str, slow_exit: Callable[[float], None], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_forks, "FORK_WAIT_S", 10.0)
    tid = _ended_thread(how, lambda: slow_exit(0.3))
    if not _present(tid):  # Python 3.13's join waits for the OS thread (pthread_join)
        pytest.skip("this Python's join returns once the thread has left the OS")
    _fork()
    assert not _present(tid), "the fork was taken while the thread was still leaving"


def test_a_fork_waits_for_a_stuck_exit_only_as_long_as_its_bound_and_once(
        slow_exit: Callable[[float], None], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_forks, "FORK_WAIT_S", 0.05)
    tid = _ended_thread("thread", lambda: slow_exit(1.0))
    if not _present(tid):  # Python 3.13's join waits for the OS thread (pthread_join)
        pytest.skip("this Python's join returns once the thread has left the OS")
    _fork()
    assert _present(tid), "the fork waited past its bound"
    assert tid not in _forks._ours, "the next fork would wait for it again"
    _fork()
    _gone(tid)


def test_a_fork_waits_for_a_pqloader_thread_making_its_first_allocation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_forks, "FORK_WAIT_S", 10.0)
    entered, allocated = threading.Event(), threading.Event()

    def first_allocation() -> None:
        entered.set()
        time.sleep(0.3)
        allocated.set()

    monkeypatch.setattr(_forks, "_first_allocation", first_allocation)
    t = _threads.thread(lambda: None, "pqloader-test")
    t.start()
    assert entered.wait(10)
    _fork()
    assert allocated.is_set(), "the fork was taken during the thread's first allocation"
    t.join()


def test_a_forked_child_knows_none_of_its_parents_threads() -> None:
    t = _threads.thread(lambda: None, "pqloader-test")
    t.start()
    t.join()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, f"{len(_forks._ours)},{len(_forks._starting)}".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 100) == b"0,0"
    os.close(read)
    os.close(write)


def _run(code: str) -> str:
    """``code`` in a fresh interpreter (its own at-fork hooks, registered before pqloader's);
    what it prints."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_no_pqloader_thread_starts_or_ends_while_the_fork_is_being_taken() -> None:
    # a hook registered before pqloader's runs after it: between its wait and the fork
    out = _run("""
        import os, threading, time
        box = {}
        def between():
            box["start"].start()  # its first allocation, were it let, comes now
            box["release"].set()  # the other thread's target returns: it would end now
            time.sleep(0.2)
            box["started"] = box["allocated"].is_set()
            box["ended"] = not os.path.exists(f"/proc/self/task/{box['tid']}")
        os.register_at_fork(before=between)
        from pqloader import _forks, _threads
        box["release"] = threading.Event()
        ending = _threads.thread(box["release"].wait, "pqloader-test")
        ending.start()
        box["tid"] = ending.native_id
        box["allocated"] = threading.Event()
        _forks._first_allocation = box["allocated"].set  # the next thread's
        box["start"] = _threads.thread(lambda: None, "pqloader-test")
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        print(box["started"], box["ended"])
    """)
    assert out == "False False", "a thread started or ended between the wait and the fork"


def test_a_fork_by_the_thread_that_holds_the_lock_is_not_a_deadlock() -> None:
    # as from a signal handler that runs while its thread is inside started() or leaving()
    out = _run("""
        import os
        from pqloader import _forks
        _forks.FORK_WAIT_S = 0.1
        with _forks._lock:
            pid = os.fork()
            if pid == 0:
                os._exit(0)
        os.waitpid(pid, 0)
        print("forked")
    """)
    assert out == "forked"
