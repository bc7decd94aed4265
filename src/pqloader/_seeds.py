"""The random generators of an epoch: each purpose its own, from the seed and numbers that place
it (epoch, window, rank, batch).

numpy takes a seed list as 32-bit words, dropping trailing zeros and splitting a large int into
as many words as it needs: ``[seed, epoch, 0]`` was ``[seed, epoch]``, so the epoch's first
window was permuted by the generator that ordered its row groups, and rank 0's first batch's
transform drew the window's permutation (found in review); ``[2**32 + 5, 0]`` was ``[5, 1]``,
so seed 2**32 + 5 began epoch 0 as seed 5 began epoch 1. Here the seed alone is the entropy,
the purpose and the numbers the spawn key, which numpy keeps apart from the entropy (it pads
the entropy to its pool's 4 words first, and mixes in every word after them): no two keys give
one generator. Each number is written in 31-bit words, all but the last with the top bit set,
so a list of numbers reads back one way only; most take one word (a transform's generator:
10.3 us to make, against 13 with two words a number and 9.5 for numpy's plain list).
"""

from __future__ import annotations

import numpy as np

FRAGMENTS = 1  # the order of an epoch's row groups
WINDOW = 2  # the order of a shuffle window's rows
TRANSFORM = 3  # a batch's random transform


def generator(purpose: int, seed: int, *numbers: int) -> np.random.Generator:
    """The generator of ``purpose`` for ``seed`` and ``numbers`` (each ``>= 0``)."""
    words = (purpose, *numbers)
    if any(n >= _TOP for n in numbers):
        words = (purpose, *(w for n in numbers for w in _words(n)))
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=words))


def _words(n: int) -> list[int]:
    out = []
    while n >= _TOP:
        out.append(_TOP | (n & (_TOP - 1)))
        n >>= 31
    return [*out, n]


_TOP = 1 << 31
