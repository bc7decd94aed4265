"""Delivery through torch's worker processes (``worker_type="process"``).

The rank's plan runs as a :class:`TorchIterable` inside ``torch.utils.data.DataLoader``, which
starts the processes, hands batches back through shared memory and, with pinning asked, pins
them on its own thread. A timeout becomes :class:`LoaderTimeoutError`, and stuck workers are
stopped rather than joined. As with threads, ``timeout`` counts from when the workers are up:
torch's own counts their start (a spawned worker imports torch: seconds on a busy machine), so
a timeout that catches a stalled read also failed every epoch's start.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import pickle
import signal
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from multiprocessing.context import set_spawning_popen
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
import torch.utils.data

from ._config import START_GRACE_S, WorkerConfig
from ._errors import InvalidArgumentError, LoaderTimeoutError
from ._ring import forget_dead, in_flight
from ._torch import Planner, TorchIterable


class ProcessDelivery:
    """torch's ``DataLoader`` over the plan; kept between epochs with ``persistent_workers``."""

    def __init__(self, planner: Planner, workers: WorkerConfig, *, pin: bool) -> None:
        self._planner = planner
        self._workers = workers
        self._pin = pin
        self._loader: torch.utils.data.DataLoader[Any] | None = None
        # Persistent workers serve one pass at a time through torch's one iterator: a pass
        # started from another thread reset it while this one was inside next() (torch's
        # KeyError or AssertionError, an empty epoch, a hang: found in review).
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:  # a loader pickles (the lock and the running
        # workers are this process's: a loader whose persistent workers ran did not pickle)
        return {**{k: v for k, v in self.__dict__.items() if k != "_lock"}, "_loader": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def forget(self) -> None:
        """Start new processes next time: persistent ones would not see a restored plan."""
        self._loader = None

    def batches(self, epoch: int, start: int,
                receive: Callable[[Any], Any]) -> Iterator[Any]:
        """Batches ``start ..`` of ``epoch``, each passed through ``receive`` in this thread."""
        w = self._workers
        lock = self._lock if w.persistent_workers else contextlib.nullcontext()
        with lock:
            loader, up = self._torch_loader()
        # torch's persistent iterator is one: iter() again resets it under an older pass,
        # which then went on with the newer pass's batches (the two shared one epoch)
        this_pass = object()
        it: Any = getattr(loader, "_iterator", None)  # a persistent one, once made
        try:
            # inside: a persistent iterator's reset drains a pass broken off, and a worker
            # that died or got stuck meanwhile must not leave it to every later epoch
            with lock:
                loader.dataset.set_epoch(  # type: ignore[attr-defined]
                    epoch, start, num_workers=w.num_workers)
                loader.pqloader_pass = this_pass
                try:
                    it = iter(loader)
                except (pickle.PicklingError, AttributeError, TypeError) as exc:
                    told = _unpicklable(self._planner, w, exc)
                    if told is None:
                        raise
                    raise InvalidArgumentError(told) from exc
                if w.persistent_workers and it not in _released:
                    # its workers end when it goes (torch's __del__, before this runs): let
                    # go of their rings then, not at some later process loader's first batch
                    _released.add(it)
                    weakref.finalize(it, forget_dead).atexit = False
            if up is not None and w.timeout:
                _await_start(it, up, w.num_workers, w.timeout)
            while True:
                with lock:  # the check and the batch, with no other pass's reset between
                    if loader.pqloader_pass is not this_pass:  # type: ignore[attr-defined]
                        raise _Superseded
                    try:
                        batch = next(it)
                    except StopIteration:
                        return
                    except (EOFError, ConnectionError) as exc:
                        died = _died(it)
                        if died is None:
                            raise
                        raise died from exc
                yield receive(batch)
        except _Superseded:
            raise InvalidArgumentError(
                "this iterator of the loader was overtaken by a newer one (iter(loader) "
                "again): with worker_type='process' and persistent_workers=True one set of "
                "worker processes serves one pass at a time. Finish or drop an iterator "
                "before the next starts, or use thread workers (the default)") from None
        except GeneratorExit:  # the caller broke off or dropped it: persistent workers stay
            raise
        except RuntimeError as exc:
            self.forget()  # persistent ones may be dead or stuck: the next epoch starts anew
            if not str(exc).startswith("DataLoader timed out"):
                _shut_down(it, w.persistent_workers)
                traceback.clear_frames(exc.__traceback__)  # as below
                raise
            for process in getattr(it, "_workers", ()):  # stuck: joining them would hang
                process.terminate()
            raise LoaderTimeoutError(
                f"no batch from a worker process within timeout={w.timeout} s; raise "
                "timeout= or look for a slow file system or transform"
            ) from exc
        except BaseException as exc:  # a worker's error, Ctrl-C (which reaches the workers too)
            self.forget()
            _shut_down(it, w.persistent_workers)
            # torch's frames that re-raised it hold it: a cycle through this loader, kept
            # (its persistent workers too) until a garbage collection (found in review)
            traceback.clear_frames(exc.__traceback__)
            raise
        finally:
            # On an error, torch's iterator lives on in the traceback's reference cycle and
            # its workers with it, until a GC pass blocks on joining them: stop them now.
            if not w.persistent_workers and hasattr(it, "_shutdown_workers"):
                it._shutdown_workers()
            forget_dead()  # their rings of shared memory (_ring.py), once no batch views them

    def _torch_loader(self) -> tuple[torch.utils.data.DataLoader[Any], Any]:
        """torch's loader over the plan: the persistent one, or a new one and a semaphore
        its workers count themselves up on (``None`` for the persistent one)."""
        w = self._workers
        if self._loader is not None:
            return self._loader, None
        # the workers' own kind: a spawn semaphore (which passes to workers however they
        # start) is a named one in /dev/shm, left there when the job is killed: one a pass
        # (found in review); a fork one has no name
        context = _context(w.multiprocessing_context)
        up = context.Semaphore(0)
        _preload(context)
        loader = torch.utils.data.DataLoader(
            TorchIterable.from_planner(self._planner), batch_size=None,
            num_workers=w.num_workers, pin_memory=self._pin, timeout=w.timeout,
            worker_init_fn=_Started(up, w.worker_init_fn, w.prefetch_factor),
            persistent_workers=w.persistent_workers,
            prefetch_factor=w.prefetch_factor,
            multiprocessing_context=w.multiprocessing_context,
            collate_fn=as_made,  # not torch's default_convert: tuples stayed no tuples
        )
        if w.persistent_workers:
            self._loader = loader
        return loader, up


def _unpicklable(planner: Planner, w: WorkerConfig, exc: BaseException) -> str | None:
    """What to tell when starting the workers failed to pickle (``exc``): the argument that
    fails to pickle just so, where processes are not forked (spawn, forkserver: Python 3.14's
    default). Pickled as for a process being started (a multiprocessing lock in a transform
    pickles then), and named only when it fails with ``exc``'s very error: else a transform
    that pickles was blamed for another part's failure (found in review)."""
    method = _context(w.multiprocessing_context).get_start_method()
    if method == "fork":
        return None
    given = {"transform": planner.config.transform, "collate_fn": planner.config.collate_fn,
             "worker_init_fn": w.worker_init_fn}
    for name, fn in given.items():
        if fn is None:
            continue
        set_spawning_popen(_Starting())  # type: ignore[arg-type]  # a stand-in
        try:
            ForkingPickler.dumps(fn)
        except Exception as why:
            if type(why) is not type(exc) or str(why) != str(exc):
                continue
            return (f"{name}={fn!r} does not pickle ({why}), and worker processes started by "
                    f"{method!r} get it pickled (Python 3.14's default start on Linux is "
                    "'forkserver'): define it at a module's top level (not a lambda or a "
                    "nested function), pass multiprocessing_context='fork' (Linux), or use "
                    "thread workers (worker_type='thread', the default)")
        finally:
            set_spawning_popen(None)
    return None


class _Starting:
    """Stands for the process being started while a callable is pickled as for it."""

    @staticmethod
    def duplicate_for_child(fd: int) -> int:
        return fd


_PRELOAD = ("torch", __name__)  # what a worker imports to unpickle the plan and run it


def _preload(context: Any) -> None:
    """Workers started by a forkserver (Python 3.14's default on Linux) each imported torch
    and pqloader: each pass's start took 1.7-4 s here, 0.03-0.12 s once the forkserver had
    them. Asked of it before it starts (once running, it is left as it is), beside what it
    was asked to load already."""
    if context.get_start_method() != "forkserver":
        return
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    if server is None or getattr(server, "_forkserver_pid", 0) is not None:
        return  # running already (or another Python's forkserver)
    asked = list(getattr(server, "_preload_modules", ["__main__"]))
    wanted = [name for name in _PRELOAD if name not in asked]
    if wanted:
        multiprocessing.set_forkserver_preload(asked + wanted)


def _context(given: Any) -> Any:
    """The multiprocessing context torch starts the workers with, for ``given``."""
    if given is None or isinstance(given, str):
        return multiprocessing.get_context(given)
    return given


_released: weakref.WeakSet[Any] = weakref.WeakSet()  # persistent iterators let go when gone


class _Superseded(Exception):
    """A newer pass took over the persistent workers (its own handling: they stay up)."""


class _Started:
    """The ``worker_init_fn`` torch runs: the user's, then one count of a worker up."""

    def __init__(self, up: Any, init: Callable[[int], Any] | None, prefetch_factor: int) -> None:
        self.up = up
        self.init = init
        self.prefetch_factor = prefetch_factor

    def __call__(self, worker_id: int) -> None:
        in_flight(self.prefetch_factor)
        try:
            if self.init is not None:
                self.init(worker_id)  # its error reaches the caller with the first batch
        finally:
            self.up.release()


def _await_start(it: Any, up: Any, workers: int, timeout: float) -> None:
    """Wait for ``workers`` processes to be up, at most ``START_GRACE_S + timeout`` s; a
    worker that died is left for torch's iterator to report."""
    limit = START_GRACE_S + timeout
    deadline = time.monotonic() + limit
    for _ in range(workers):
        while not up.acquire(timeout=0.1):
            processes = getattr(it, "_workers", ())
            if any(not p.is_alive() for p in processes):
                return
            if time.monotonic() >= deadline:
                for process in processes:  # stuck: joining them would hang
                    process.terminate()
                raise LoaderTimeoutError(
                    f"worker processes had not started within {limit:g} s (importing modules, "
                    "running worker_init_fn); look for a worker_init_fn that does not return"
                )


def _died(it: Any, wait_s: float = 1.0) -> RuntimeError | None:
    """A worker process that died, told as torch tells it, where a batch it had sent could
    not be received: its tensors' file descriptors are fetched from the worker, and one
    killed meanwhile (the OOM killer, say) surfaced as a bare EOFError from multiprocessing
    (found under Python 3.13). None if every worker is alive after ``wait_s``."""
    workers = getattr(it, "_workers", ())
    # (one that ended its share of an IterableDataset exits, and torch marks it not running:
    # not a death, found in review)
    running = getattr(it, "_workers_status", [True] * len(workers))
    deadline = time.monotonic() + wait_s
    while True:
        dead = [w for w, up in zip(workers, running, strict=False) if up and not w.is_alive()]
        if dead or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    if not dead:
        return None
    how = ", ".join(f"pid {w.pid}: {_exit(w.exitcode)}" for w in dead)
    return RuntimeError(f"DataLoader worker exited unexpectedly ({how}) while its batch was "
                        "being received; if it was killed for memory, lower num_workers or "
                        "set memory_budget_bytes")


def _exit(code: int | None) -> str:
    if code is None or code >= 0:
        return f"exit code {code}"
    with contextlib.suppress(ValueError):
        return f"killed by signal {signal.Signals(-code).name}"
    return f"killed by signal {-code}"


def _shut_down(it: Any, persistent: bool) -> None:
    """Stop a persistent iterator's workers after an error (a dead worker, an interrupt):
    kept, every later epoch failed at once with "worker exited unexpectedly"."""
    if persistent and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()


def as_made(batch: Any) -> Any:
    """A batch as the worker made it (torch's ``collate_fn``, at module level: it pickles)."""
    return batch
