"""The batches a conversion steps through: as many as it asks for, from whatever iterable the user gave.

A re-iterable (a list, a DataLoader) is iterated again each time it runs out. A one-shot iterator (a generator)
is read once; it is remembered only while it has given at most :data:`REMEMBER` batches, so that a short one can
be cycled like a list, while an endless one is never held in memory."""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import torch

__all__ = ["batch_stream", "take_and_keep", "REMEMBER"]

REMEMBER = 64  # batches of a one-shot iterator kept for cycling it; past that it is not kept, and must not run out


def batch_stream(batches: Iterable) -> Iterator:
    """An endless iterator over ``batches`` (a single tensor: that batch at every step). ValueError at once if
    there is none; a one-shot iterator longer than :data:`REMEMBER` batches that runs out is a ValueError
    when it does."""
    if isinstance(batches, torch.Tensor):
        return itertools.repeat(batches)
    if iter(batches) is not batches:  # re-iterable: a fresh pass each time
        first = next(iter(batches), _END)
        if first is _END:
            raise ValueError("reluize got no batches")
        return itertools.chain.from_iterable(_passes(batches))
    first = next(batches, _END)
    if first is _END:
        raise ValueError("reluize got no batches")
    return _remembered(itertools.chain([first], batches))


_END = object()


def _passes(batches: Iterable):
    while True:
        yield iter(batches)


def _remembered(iterator: Iterator):
    kept = []
    for batch in iterator:
        if kept is not None:
            kept.append(batch)
            if len(kept) > REMEMBER:
                kept = None
        yield batch
    if kept is None:
        raise ValueError(f"reluize: the batches ran out, and a one-shot iterator of more than {REMEMBER} batches is "
                         "not kept to cycle it: give a re-iterable (a list, a DataLoader), or an iterator with a "
                         "batch for every step")
    yield from itertools.cycle(kept)


def take_and_keep(stream: Iterator, n: int):
    """The next ``n`` batches of ``stream``, and the stream with them back in front (the steps use them again)."""
    batches = [next(stream) for _ in range(n)]
    return batches, itertools.chain(batches, stream)
