import random
import sys

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.text import char_ids


def python_char_ids(tokens, max_chars):
    """The spec (Part 1) in plain Python: the original batcher's ids + 1, for one sentence."""
    def row(token):
        if token == "<S>":
            return [259, 257, 260] + [261] * (max_chars - 3)
        if token == "</S>":
            return [259, 258, 260] + [261] * (max_chars - 3)
        data = token.encode("utf-8", "ignore")[: max_chars - 2]
        return [259] + [b + 1 for b in data] + [260] + [261] * (max_chars - 2 - len(data))

    return [row("<S>")] + [row(t) for t in tokens] + [row("</S>")]


def test_fixture_char_ids_exactly(fixture):
    expected = fixture.ref["char_ids"]
    ragged = tf.ragged.constant(fixture.sentences, dtype=tf.string, ragged_rank=1)
    np.testing.assert_array_equal(char_ids.batch_char_ids(ragged, 50).numpy(), expected)
    text = tf.constant([" ".join(s) for s in fixture.sentences])
    np.testing.assert_array_equal(char_ids.text_to_char_ids(text, 50).numpy(), expected)


def test_spec_examples():
    ids = char_ids.batch_char_ids(tf.ragged.constant([["The", "北京"]]), 50).numpy()[0]
    assert ids[0, :4].tolist() == [259, 257, 260, 261]
    assert ids[1, :6].tolist() == [259, 85, 105, 102, 260, 261]
    assert ids[2, :9].tolist() == [259, 230, 141, 152, 229, 187, 173, 260, 261]
    assert ids[3, :4].tolist() == [259, 258, 260, 261]


def test_truncation_at_bytes_and_special_tokens():
    tokens = ["a" * 48, "a" * 49, "a" + "é" * 30, "<S>", "</S>", "<UNK>", ""]
    got = char_ids.batch_char_ids(tf.ragged.constant([tokens]), 50).numpy()[0]
    assert got.tolist() == python_char_ids(tokens, 50)
    np.testing.assert_array_equal(got[1], got[2])  # 48 and 49 'a' give identical ids
    assert got[3, 48] == 0xC3 + 1 and got[3, 49] == 260  # 'é' cut in half at the 48-byte limit


def test_padding_slots_are_zero_and_shapes():
    ids = char_ids.batch_char_ids(tf.ragged.constant([["a", "b", "c"], [], ["d"]]), 10).numpy()
    assert ids.shape == (3, 5, 10)
    assert ids[1, 2:].max() == 0 and ids[1, :2].min() > 0  # empty sentence: BOS, EOS, then padding
    assert ids[2, 3:].max() == 0
    assert char_ids.text_to_char_ids(tf.constant([], tf.string), 10).shape == (0, 2, 10)
    assert char_ids.text_to_char_ids(tf.constant(["", "  "]), 10).shape == (2, 2, 10)


PY_WHITESPACE = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()]


def test_split_matches_python_str_split_on_random_unicode():
    rng = random.Random(0)
    alphabet = PY_WHITESPACE + list("ab.é北😀\u200b\ufeff") + ["<S>"]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(300)]
    texts += ["".join(PY_WHITESPACE), "x" + "y".join(PY_WHITESPACE) + "z"]
    got = char_ids.split_whitespace(tf.constant(texts)).to_list()
    assert [[t.decode("utf-8") for t in row] for row in got] == [t.split() for t in texts]


def test_random_sentences_match_python_statement():
    rng = random.Random(1)
    alphabet = list("abcXYZ-'.,") + ["é", "ß", "北", "😀", "€"]
    sentences = [
        ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 25))) for _ in range(rng.randint(0, 6))]
        for _ in range(20)
    ]
    got = char_ids.batch_char_ids(tf.ragged.constant(sentences, dtype=tf.string, ragged_rank=1), 16).numpy()
    for row, sentence in zip(got, sentences):
        expected = python_char_ids(sentence, 16)
        assert row[: len(expected)].tolist() == expected
        assert row[len(expected) :].max(initial=0) == 0


def test_dense_tokens_ignore_columns_past_length():
    tokens = tf.constant([["a", "b", "junk"], ["c", "", ""]])
    got = char_ids.dense_tokens_to_char_ids(tokens, tf.constant([2, 1]), 8).numpy()
    expected = char_ids.batch_char_ids(tf.ragged.constant([["a", "b"], ["c"]]), 8).numpy()
    np.testing.assert_array_equal(got, expected)


def test_same_in_tf_data_batched_and_not_and_in_tf_function(fixture):
    text = [" ".join(s) for s in fixture.sentences]
    direct = char_ids.text_to_char_ids(tf.constant(text), 50).numpy()
    # batched: the whole batch through Dataset.map
    ds = tf.data.Dataset.from_tensor_slices(text).batch(len(text)).map(lambda t: char_ids.text_to_char_ids(t, 50))
    np.testing.assert_array_equal(next(iter(ds)).numpy(), direct)
    # not batched: one sentence at a time (each padded only to its own length)
    single = tf.data.Dataset.from_tensor_slices(text).map(lambda t: char_ids.text_to_char_ids(t[None], 50)[0])
    for row, got in zip(direct, single):
        np.testing.assert_array_equal(got.numpy(), row[: got.shape[0]])
        assert row[got.shape[0] :].max(initial=0) == 0
    fn = tf.function(lambda t: char_ids.text_to_char_ids(t, 50), input_signature=[tf.TensorSpec([None], tf.string)])
    np.testing.assert_array_equal(fn(tf.constant(text)).numpy(), direct)


def test_batch_char_ids_rejects_non_ragged():
    with pytest.raises(TypeError, match="RaggedTensor"):
        char_ids.batch_char_ids(tf.constant([["a"]]), 50)
    with pytest.raises(ValueError, match="string RaggedTensor of rank 2"):
        char_ids.batch_char_ids(tf.ragged.constant([[1, 2]]), 50)


def test_cjk_chars_tokenizer():
    got = char_ids.split_text(tf.constant(["我爱 NLP 北京。", "", "abc 漢字x"]), "cjk_chars").to_list()
    as_text = [[t.decode("utf-8") for t in row] for row in got]
    assert as_text == [["我", "爱", "NLP", "北", "京", "。"], [], ["abc", "漢", "字", "x"]]
    with pytest.raises(ValueError, match="Unknown tokenizer"):
        char_ids.split_text(tf.constant(["a"]), "spaces")
