"""Delivery through torch's worker processes (``worker_type="process"``).

The rank's plan runs as a :class:`TorchIterable` inside ``torch.utils.data.DataLoader``, which
starts the processes, hands batches back through shared memory and, with pinning asked, pins
them on its own thread. A timeout becomes :class:`LoaderTimeoutError`, and stuck workers are
stopped rather than joined.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils.data

from ._config import WorkerConfig
from ._errors import LoaderTimeoutError
from ._torch import Planner, TorchIterable


class ProcessDelivery:
    """torch's ``DataLoader`` over the plan; kept between epochs with ``persistent_workers``."""

    def __init__(self, planner: Planner, workers: WorkerConfig, *, pin: bool) -> None:
        self._planner = planner
        self._workers = workers
        self._pin = pin
        self._loader: torch.utils.data.DataLoader[Any] | None = None

    def forget(self) -> None:
        """Start new processes next time: persistent ones would not see a restored plan."""
        self._loader = None

    def batches(self, epoch: int, start: int,
                receive: Callable[[Any], Any]) -> Iterator[Any]:
        """Batches ``start ..`` of ``epoch``, each passed through ``receive`` in this thread."""
        w = self._workers
        loader = self._loader
        if loader is None:
            loader = torch.utils.data.DataLoader(
                TorchIterable.from_planner(self._planner), batch_size=None,
                num_workers=w.num_workers, pin_memory=self._pin, timeout=w.timeout,
                worker_init_fn=w.worker_init_fn, persistent_workers=w.persistent_workers,
                prefetch_factor=w.prefetch_factor,
                multiprocessing_context=w.multiprocessing_context,
                collate_fn=as_made,  # not torch's default_convert: tuples stayed no tuples
            )
            if w.persistent_workers:
                self._loader = loader
        loader.dataset.set_epoch(epoch, start)  # type: ignore[attr-defined]
        it = iter(loader)
        try:
            yield from map(receive, it)
        except RuntimeError as exc:
            self.forget()  # persistent ones may be dead or stuck: the next epoch starts anew
            if not str(exc).startswith("DataLoader timed out"):
                _shut_down(it, w.persistent_workers)
                raise
            for process in getattr(it, "_workers", ()):  # stuck: joining them would hang
                process.terminate()
            raise LoaderTimeoutError(
                f"no batch from a worker process within timeout={w.timeout} s; raise "
                "timeout= or look for a slow file system or transform"
            ) from exc
        except BaseException:  # a worker's error, Ctrl-C (which reaches the workers too)
            self.forget()
            _shut_down(it, w.persistent_workers)
            raise
        finally:
            # On an error, torch's iterator lives on in the traceback's reference cycle and
            # its workers with it, until a GC pass blocks on joining them: stop them now.
            if not w.persistent_workers and hasattr(it, "_shutdown_workers"):
                it._shutdown_workers()


def _shut_down(it: Any, persistent: bool) -> None:
    """Stop a persistent iterator's workers after an error (a dead worker, an interrupt):
    kept, every later epoch failed at once with "worker exited unexpectedly"."""
    if persistent and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()


def as_made(batch: Any) -> Any:
    """A batch as the worker made it (torch's ``collate_fn``, at module level: it pickles)."""
    return batch
