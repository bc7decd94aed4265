"""How a ``transform=`` is called: with the batch alone, or with its generator too (by
position or by a keyword-only parameter), and how that generator is seeded."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ._seeds import TRANSFORM, generator

_RNG_NAMES = ("rng", "generator", "gen")


def transform_rng(seed: int, epoch: int, rank: int, position: int) -> np.random.Generator:
    """The generator of batch ``position`` of ``rank`` in ``epoch`` (apart from the shuffle's:
    see ``_seeds.py``)."""
    return generator(TRANSFORM, seed, epoch, rank, position)


def transform_arity(transform: Callable[..., Any] | None) -> int:
    """1 for ``transform(batch)``, 2 for ``transform(batch, rng)``.

    The generator is passed when a second positional parameter is required, or is named
    ``rng`` (or ``generator``) even with a default. Not for ``f(batch, scale=2.0)``, nor for
    ``*args`` alone: a ``torch.nn.Module`` (``__call__(*args, **kwargs)``; its ``forward`` is
    read instead), ``nn.Sequential`` or a torchvision transform takes the batch alone.
    """
    if transform is None:
        return 0
    params = _parameters(transform)
    if params is None:  # builtins without a signature
        return 1
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2:
        return 1
    second = positional[1]
    return 2 if second.default is second.empty or second.name in _RNG_NAMES else 1


def transform_rng_keyword(transform: Callable[..., Any] | None) -> str | None:
    """The keyword-only parameter the generator goes to (``def f(batch, *, rng=None)``: it got
    None, silently, found in review), where :func:`transform_arity` passes none: one named
    ``rng`` (or ``generator``, ``gen``), and not one a ``functools.partial`` has bound."""
    if transform is None or transform_arity(transform) == 2:
        return None
    bound = transform.keywords if isinstance(transform, functools.partial) else {}
    for p in _parameters(transform) or ():
        if p.kind is p.KEYWORD_ONLY and p.name in _RNG_NAMES and p.name not in bound:
            return p.name
    return None


def _parameters(transform: Callable[..., Any]) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(_called(transform)).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature
        return None


def _called(transform: Callable[..., Any]) -> Callable[..., Any]:
    """What a call of ``transform`` runs, as its parameters tell: a module's ``forward``
    (``__call__`` takes ``*args``), through ``torch.compile``'s wrapper and a
    ``functools.partial`` (both read as taking the batch alone: the generator went missing,
    silently, found in review)."""
    if isinstance(transform, functools.partial):
        inner = _called(transform.func)
        return transform if inner is transform.func else \
            functools.partial(inner, *transform.args, **transform.keywords)
    if isinstance(transform, torch.nn.Module):
        original = getattr(transform, "_orig_mod", None)  # torch.compile's OptimizedModule
        module = original if isinstance(original, torch.nn.Module) else transform
        if callable(forward := getattr(module, "forward", None)):
            return forward  # type: ignore[no-any-return]
    return transform
