"""elmo_tf/utils/batching.py: batches by length, bounded by rows and padded slots."""

import numpy as np

from elmo_tf.utils.batching import length_batches, order_around


def test_sorted_runs_bounded_by_rows_and_padded_slots():
    lengths = np.array([3, 3, 3, 4, 12, 1, 1, 1, 1, 1])
    assert [list(b) for b in length_batches(lengths, 4)] == [[5, 6, 7, 8], [9, 0, 1, 2], [3, 4]]
    assert [list(b) for b in length_batches(lengths, 4, max_tokens=10)] == [[5, 6, 7, 8], [9, 0, 1], [2, 3], [4]]
    assert [list(b) for b in length_batches(lengths, 4, max_tokens=10, sort=False)] == [
        [0, 1, 2], [3], [4], [5, 6, 7, 8], [9]]
    assert length_batches([], 4) == []


def test_training_batches_are_jittered_and_shuffled_reproducibly():
    lengths = np.arange(100) % 7
    a = length_batches(lengths, 8, rng=np.random.RandomState(3))
    b = length_batches(lengths, 8, rng=np.random.RandomState(3))
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == len(b) == 13
    assert sorted(np.concatenate(a).tolist()) == list(range(100))
    assert [list(x) for x in a] != [list(x) for x in length_batches(lengths, 8)]


def test_order_around_takes_no_longer_items_longest_first_then_longer_shortest_first():
    lengths = [5, 9, None, 3, 5, 12, 7, 1]
    order = order_around(5, lengths)
    assert order == [0, 4, 3, 7, 6, 1, 5, 2]  # 5, 5 (ties in order), 3, 1, then 7, 9, 12, then unknown
    assert sorted(order) == list(range(len(lengths)))
    assert order_around(0, [2, 1]) == [1, 0] and order_around(4, []) == []
