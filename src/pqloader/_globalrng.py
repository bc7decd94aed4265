"""A thread worker's ``worker_init_fn``, kept from reseeding the process's global generators.

torch gives each worker process generators of its own; thread workers share the training
loop's (torch's, numpy's legacy ``np.random``, Python's ``random``). A ``worker_init_fn`` that
seeds them, as torch's docs show (``np.random.seed(torch.initial_seed() % 2**32)``,
``torch.manual_seed(base + worker_id)``), reseeded the loop's at every epoch's start: the same
dropout and the same draws each epoch (found in review). A generator reseeded there is put
back, and a warning says why. One only drawn from meanwhile (the loop's draws) is left as it
is: reseeded means torch's state is a fresh one of its ``initial_seed``, or a Mersenne Twister
at the start of its state (position 624), and other than before.

Inits that run at once (a loader's threads start together) share one look before the first
and one after the last: each thread's own would see and put back another's seed. They run
unlocked (an init that waits for another, or never returns, holds up no one; while one never
returns, reseeding is not undone).
"""

from __future__ import annotations

import random
import threading
import warnings
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch

_FRESH = 624  # a Mersenne Twister's position once seeded (numpy's and Python's)
_lock = threading.Lock()
_running = 0  # inits under way
_before: dict[str, Any] = {}  # the generators' states before the first of them


def call_init(init: Callable[[int], Any], index: int) -> None:
    """``init(index)`` in a worker thread, the global generators it reseeds put back."""
    global _running, _before
    with _lock:
        if not _running:
            _before = _states()
        _running += 1
    try:
        init(index)
    finally:
        with _lock:
            _running -= 1
            reseeded = [] if _running else _put_back(_before)
        if reseeded:  # shown once (warnings' default filter)
            warnings.warn(
                f"worker_init_fn called {', '.join(reseeded)}: thread workers share this "
                "process's random generators with the training loop, which that reseeded at "
                "every epoch; they were put back. Draw a transform's randomness from its rng "
                "argument (transform=fn(batch, rng)), or pass worker_type='process' for "
                "generators of each worker's own", RuntimeWarning, stacklevel=3)


def _np_state() -> tuple[Any, ...]:
    return cast(tuple[Any, ...], np.random.get_state(legacy=True))


def _states() -> dict[str, Any]:
    states = {"torch": torch.get_rng_state(), "numpy": _np_state(), "random": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        # manual_seed seeds them too
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _put_back(before: dict[str, Any]) -> list[str]:
    """The generators reseeded since ``before``, each put back to it; their seeding calls."""
    reseeded = []
    now = torch.get_rng_state()
    fresh = torch.Generator().manual_seed(torch.initial_seed()).get_state()
    if torch.equal(now, fresh) and not torch.equal(now, before["torch"]):
        torch.set_rng_state(before["torch"])
        if "cuda" in before:
            torch.cuda.set_rng_state_all(before["cuda"])
        reseeded.append("torch.manual_seed")
    np_now = _np_state()
    if np_now[2] == _FRESH and not np.array_equal(np_now[1], before["numpy"][1]):
        np.random.set_state(before["numpy"])
        reseeded.append("np.random.seed")
    py_now = random.getstate()
    if py_now[1][-1] == _FRESH and py_now != before["random"]:
        random.setstate(before["random"])
        reseeded.append("random.seed")
    return reseeded
