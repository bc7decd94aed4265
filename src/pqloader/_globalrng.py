"""A thread worker's ``worker_init_fn``, kept from reseeding the process's global generators.

torch gives each worker process generators of its own; thread workers share the training
loop's (torch's, numpy's legacy ``np.random``, Python's ``random``). A ``worker_init_fn`` that
seeds them, as torch's docs show (``np.random.seed(torch.initial_seed() % 2**32)``,
``torch.manual_seed(base + worker_id)``), reseeded the loop's at every epoch's start: the same
dropout and the same draws each epoch (found in review). A generator reseeded there is put
back, and a warning says why. One only drawn from meanwhile (the loop's draws) is left as it
is: seeded means torch's ``initial_seed`` changed, or a Mersenne Twister at the start of its
state (position 624) with other keys.
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
# One at a time: a thread's look before its init saw another's seed, and put that back.
_lock = threading.Lock()


def _np_state() -> tuple[Any, ...]:
    return cast(tuple[Any, ...], np.random.get_state(legacy=True))


def call_init(init: Callable[[int], Any], index: int) -> None:
    """``init(index)`` in a worker thread, the global generators it reseeds put back."""
    with _lock:
        _call_init(init, index)


def _call_init(init: Callable[[int], Any], index: int) -> None:
    seed, state = torch.initial_seed(), torch.get_rng_state()
    np_state, py_state = _np_state(), random.getstate()
    try:
        init(index)
    finally:
        reseeded = []
        if torch.initial_seed() != seed:
            torch.set_rng_state(state)
            reseeded.append("torch.manual_seed")
        now = _np_state()
        if now[2] == _FRESH and not np.array_equal(now[1], np_state[1]):
            np.random.set_state(np_state)
            reseeded.append("np.random.seed")
        py_now = random.getstate()
        if py_now[1][-1] == _FRESH and py_now != py_state:
            random.setstate(py_state)
            reseeded.append("random.seed")
        if reseeded:  # shown once (warnings' default filter)
            warnings.warn(
                f"worker_init_fn called {', '.join(reseeded)}: thread workers share this "
                "process's random generators with the training loop, which that reseeded at "
                "every epoch; they were put back. Draw a transform's randomness from its rng "
                "argument (transform=fn(batch, rng)), or pass worker_type='process' for "
                "generators of each worker's own", RuntimeWarning, stacklevel=3)
