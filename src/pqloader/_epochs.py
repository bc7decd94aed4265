"""Which epoch a :class:`pqloader.DataLoader`'s next pass is.

``set_epoch`` chooses it. Without it, in one process, a pass begun after a pass that took its
epoch's last batch is the next epoch: torch's ``DataLoader(shuffle=True)`` shuffles anew at
every pass, and a loop without ``set_epoch`` repeated its first epoch's order and augmentation
(found in review). Over ranks only a state at its epoch's end moves it on (every rank loads
it): ranks that made other numbers of passes (rank 0 alone fitting a normalizer first) planned
other epochs, silently (found in review). A pass begun after one left early starts its epoch
over. A shuffled epoch begun again is warned of, once a loader.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Generator, Iterator
from typing import TypeVar

from ._errors import IncompleteEpochError

T = TypeVar("T")


class NextEpoch:
    """The loader's record of its passes, as far as the next pass's epoch depends on them."""

    def __init__(self, *, world_size: int, shuffle: bool) -> None:
        self._one_process = world_size == 1
        self._shuffle = shuffle
        self._ended: int | None = None  # the epoch the latest pass ended (None: it did not)
        self._loaded_end = False  # ... as a state loaded at its end says
        self._chosen = False  # set_epoch called since the latest pass began
        self._told = False

    def chosen(self) -> None:
        """set_epoch was called."""
        self._chosen = True

    def loaded(self, epoch: int, *, at_end: bool) -> None:
        """A state of ``epoch`` was loaded (``at_end``: saved at that epoch's end)."""
        self._ended, self._loaded_end, self._chosen = (epoch if at_end else None), at_end, False

    def ended(self, epoch: int) -> None:
        """The latest pass took ``epoch``'s last batch."""
        self._ended = epoch

    def advances(self, epoch: int) -> bool:
        """Whether a pass begun now, the loader at ``epoch``, is the next epoch."""
        return not self._chosen and self._ended == epoch and (
            self._loaded_end or self._one_process)

    def begin(self, epoch: int, batches: int, *, resuming: bool) -> bool:
        """A pass begins at ``epoch``, ``batches`` of it taken so far (``resuming``: a loaded
        state's pass): whether it is the next epoch. A shuffled epoch begun again is warned
        of."""
        advance, chosen, ended = self.advances(epoch), self._chosen, self._ended
        self._chosen, self._ended, self._loaded_end = False, None, False
        if advance or chosen or not self._shuffle or self._told or resuming:
            return advance
        if ended == epoch:  # over ranks
            told = (f"this pass repeats epoch {epoch}'s order: over several ranks the epoch "
                    "moves on only by set_epoch (ranks that made other numbers of passes "
                    "would plan other epochs): call loader.set_epoch(epoch) on every rank "
                    "before each epoch")
        elif batches > 1:
            told = (f"this pass starts epoch {epoch} over, in the order of the pass left after "
                    f"{batches} batches: call loader.set_epoch(epoch) before each epoch for a "
                    "new order (or load_state_dict to go on where a pass was left)")
        else:
            return False
        self._told = True
        warnings.warn(told, stacklevel=4)  # (begin, _next_epoch, __iter__: the caller's loop)
        return False


class Pass(Iterator[T]):
    """One pass's batches. Once an error ended it, the next ``next`` raises
    :class:`IncompleteEpochError` (once; then the pass is over): a generator ends at its error,
    so a loop that caught a batch's error and went on took the pass's end for the epoch's, its
    other batches never delivered, without a word (found by fuzzing: 0 of 2,400 rows). Raised
    again and again instead, such a loop would never end."""

    def __init__(self, batches: Generator[T, None, None], yielded: Callable[[], int] | None,
                 resume: str = "Iterate the loader again to start the epoch over, or load "
                 "its state_dict() (it counts the batches delivered) to go on from the failed "
                 "one", *, before: int = 0) -> None:
        """``yielded``: the batches of the epoch delivered (None: ``before`` and this pass's)."""
        self._batches = batches
        self._yielded = yielded
        self._resume = resume
        self._given = before
        self._failed: str | None = None  # the error, told (held, it held this pass's frame:
        # a cycle that kept the loader and its workers until a garbage collection)

    def __iter__(self) -> Pass[T]:
        return self

    def __next__(self) -> T:
        if (failed := self._failed) is not None:
            self._failed = None
            raise IncompleteEpochError(
                f"this pass ended at an error ({failed}) after "
                f"{self._given if self._yielded is None else self._yielded():,} batches of "
                "its epoch; the others were not delivered. "
                f"{self._resume}")
        try:
            batch = next(self._batches)
            self._given += 1
            return batch
        except StopIteration:
            raise
        except Exception as exc:
            self._failed = f"{type(exc).__name__}: {exc}"
            raise

    def close(self) -> None:
        """End the pass early, as a generator's ``close`` does (its workers stop)."""
        self._batches.close()
