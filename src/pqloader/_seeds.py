"""The random generators of an epoch: each purpose its own, from the seed and numbers that place
it (epoch, window, rank, batch).

numpy takes a seed list as 32-bit words, dropping trailing zeros and splitting a large int into
as many words as it needs: ``[seed, epoch, 0]`` was ``[seed, epoch]``, so the epoch's first
window was permuted by the generator that ordered its row groups, and rank 0's first batch's
transform drew the window's permutation (found in review); ``[2**32 + 5, 0]`` was ``[5, 1]``,
so seed 2**32 + 5 began epoch 0 as seed 5 began epoch 1. Here the seed alone is the entropy,
the purpose and the numbers (two words each, their count first) the spawn key, which numpy keeps
apart from the entropy: no two keys give one generator.
"""

from __future__ import annotations

import numpy as np

FRAGMENTS = 1  # the order of an epoch's row groups
WINDOW = 2  # the order of a shuffle window's rows
TRANSFORM = 3  # a batch's random transform


def generator(purpose: int, seed: int, *numbers: int) -> np.random.Generator:
    """The generator of ``purpose`` for ``seed`` and ``numbers`` (each ``>= 0``)."""
    words = [w for n in numbers for w in (n & 0xFFFFFFFF, n >> 32)]
    return np.random.default_rng(
        np.random.SeedSequence(seed, spawn_key=(purpose, len(numbers), *words)))
