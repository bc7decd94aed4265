"""The epoch's random generators (``_seeds.py``): one per purpose, no two keys alike."""

from __future__ import annotations

import numpy as np

from pqloader._plan import Window, fragment_order, plan_epoch
from pqloader._seeds import TRANSFORM, WINDOW, generator
from pqloader._slices import Slice


def test_the_first_window_is_not_permuted_by_the_fragment_orders_generator() -> None:
    """Keyed [seed, epoch, 0], it was: numpy drops trailing zeros (found in review)."""
    plan = plan_epoch(np.full(40, 10), batch_size=8, rank=0, world_size=1, num_workers=1,
                      seed=7, epoch=3, shuffle=True, drop_last=False, window_rows=40)
    first = plan.workers[0].segments[0].window
    assert first.num_rows == 40 and first.key is not None and first.key[-1] == 0
    assert not np.array_equal(first.order(), fragment_order(40, seed=7, epoch=3, shuffle=True))


def test_a_large_seed_does_not_begin_an_epoch_as_a_small_one_another() -> None:
    """[2**32 + 5, 0] was [5, 1] to numpy: seed 2**32 + 5 began epoch 0 as seed 5 epoch 1."""
    assert not np.array_equal(fragment_order(100, seed=2**32 + 5, epoch=0, shuffle=True),
                              fragment_order(100, seed=5, epoch=1, shuffle=True))
    big, small = (Window((Slice(0, 0, 100),), key) for key in [(2**32 + 5, 0, 0), (5, 1, 0)])
    assert not np.array_equal(big.order(), small.order())


def test_keys_that_numpy_would_take_alike_give_other_generators() -> None:
    draws = {
        (purpose, seed, numbers): generator(purpose, seed, *numbers).integers(2**62)
        for purpose in (WINDOW, TRANSFORM)
        for seed in (0, 5, 2**32 + 5, 2**64 + 5)
        for numbers in [(), (0,), (0, 0), (1,), (1, 0), (0, 1), (2**31,), (2**31, 1), (0, 1, 0),
                        (2**31 + 1,), (1, 1), (2**64,), (2**62, 0)]
    }
    assert len(set(draws.values())) == len(draws)
