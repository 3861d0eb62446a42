"""Batches of items of similar length, so that padding to a batch's longest item stays small.

`length_batches` cuts a known set of items into batches (embedding files, training); `order_around` is the
online variant (the server's batcher): in which order queued items join a batch that must hold a given one.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


def length_batches(
    lengths: Sequence[int],
    batch_size: int,
    max_tokens: Optional[int] = None,
    rng: Optional[np.random.RandomState] = None,
    *,
    sort: bool = True,
) -> list[np.ndarray]:
    """Indices into `lengths`, in batches: consecutive runs of the items sorted by length (stably).

    Args:
      lengths: each item's length (tokens, or an estimate of them).
      batch_size: at most this many items per batch.
      max_tokens: at most this many padded slots (items x longest length) per batch; an item longer than
        that goes alone.
      rng: for training: sort by lengths jittered by U(0, 3), and shuffle the order of the batches.
      sort: False keeps the input order (runs of consecutive items).
    Returns:
      a list of int64 index arrays; every item is in exactly one.
    """
    lengths = np.asarray(lengths)
    keys = lengths.astype(np.float64)
    if rng is not None:
        keys = keys + rng.uniform(0, 3, size=len(keys))
    order = np.argsort(keys, kind="stable") if sort else np.arange(len(keys))
    if max_tokens is None:
        batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    else:
        batches = list(_token_bounded_runs(order, lengths, batch_size, max_tokens))
    if rng is not None:
        rng.shuffle(batches)
    return batches


def _token_bounded_runs(order: np.ndarray, lengths: np.ndarray, batch_size: int, max_tokens: int):
    begin = 0
    while begin < len(order):
        end, width = begin, 0
        while end < len(order) and end - begin < batch_size:
            width = max(width, int(lengths[order[end]]))
            if end > begin and (end - begin + 1) * width > max_tokens:
                break
            end += 1
        yield order[begin:end]
        begin = end


def order_around(anchor: int, lengths: Sequence[Optional[int]]) -> list[int]:
    """Indices of `lengths` in the order they should join a batch that holds an item of length `anchor`.

    First the items no longer than `anchor`, from the longest down (they add no padding), then the longer ones
    from the shortest up; items of unknown length (None) last. Ties keep their order in `lengths`.
    """
    shorter = sorted((i for i, n in enumerate(lengths) if n is not None and n <= anchor), key=lambda i: -lengths[i])
    longer = sorted((i for i, n in enumerate(lengths) if n is not None and n > anchor), key=lambda i: lengths[i])
    return shorter + longer + [i for i, n in enumerate(lengths) if n is None]
