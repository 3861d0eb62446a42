"""The original's word-input biLM (options without `char_cnn`) against bilm-tf on tests/fixtures/tiny_word_input.

The fixture: `options.json` (no char_cnn, no n_tokens_vocab), `weights.hdf5` (LSTM only), `embedding.hdf5` (the word
table, `[|vocab|, P]`, no padding row: bilm-tf adds a zero row 0 and feeds vocabulary index + 1), `vocab.txt`, and
`reference.npz` from bilm-tf with `use_character_inputs=False`: `lm_embeddings` [B, 3, T, 2P], `mask`, `lengths`,
`elmo` (the plain mean of the layers) and `token_ids` [B, T + 2] (TokenBatcher: `<S>`, the tokens, `</S>`, then 0).
Outputs are compared only where `mask` is true (the original's padded positions are not zero).
"""

import shutil

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.errors import WeightFileError
from elmo_tf.model.weights_io import load_original, read_word_table
from elmo_tf.text.vocab import Vocabulary
from tests.conftest import FIXTURES

TOL = 1e-5
DIR = FIXTURES / "tiny_word_input"
OPTIONS, WEIGHTS = str(DIR / "options.json"), str(DIR / "weights.hdf5")
EMBEDDING, VOCAB = str(DIR / "embedding.hdf5"), str(DIR / "vocab.txt")
REF = dict(np.load(DIR / "reference.npz"))
SENTENCES = [line.split() for line in (DIR / "sentences.txt").read_text(encoding="utf-8").splitlines()]
WORDS = tuple(Vocabulary.from_file(VOCAB).words)


@pytest.fixture(scope="module")
def models():
    """The model loaded with explicit files, and with the defaults beside the weight file."""
    return {
        "explicit": load_original(OPTIONS, WEIGHTS, embedding_file=EMBEDDING, vocab_file=VOCAB),
        "defaults": load_original(OPTIONS, WEIGHTS),
    }


def inputs(bilm, sentences=SENTENCES):
    return bilm.encoder.sentences(tf.ragged.constant(sentences, dtype=tf.string, ragged_rank=1))


def test_the_fixture_has_unknown_words():
    assert sum(w not in WORDS for s in SENTENCES for w in s) >= 5  # "fox", "北京", "résumé", ...
    assert WORDS[:3] == ("<S>", "</S>", "<UNK>")


@pytest.mark.parametrize("how", ["explicit", "defaults"])
def test_matches_the_original(how, models):
    bilm = models[how]
    assert bilm.char_cnn is None and bilm.token_cache is None
    assert bilm.lexicons.words == WORDS
    np.testing.assert_array_equal(bilm.word_embed.embedding.numpy(), read_word_table(EMBEDDING))
    out = bilm(inputs(bilm))
    mask = REF["mask"]
    np.testing.assert_array_equal(out["mask"].numpy(), mask)
    np.testing.assert_array_equal(out["sequence_len"].numpy(), REF["lengths"])
    assert len(out["layers"]) == REF["lm_embeddings"].shape[1] == 3
    for k, layer in enumerate(out["layers"]):
        err = np.abs(layer.numpy() - REF["lm_embeddings"][:, k])[mask].max()
        assert err < TOL, f"layer {k}: {err}"
        assert np.all(layer.numpy()[~mask] == 0.0)
    elmo = np.mean([layer.numpy() for layer in out["layers"]], axis=0)
    assert np.abs(elmo - REF["elmo"])[mask].max() < TOL


def test_word_ids_are_the_token_batchers(models):
    """[B, T + 2]: `<S>` (index 0 + 1), vocabulary index + 1 per token, `</S>` (1 + 1), then 0; unknown -> `<UNK>`."""
    ids = inputs(models["explicit"])
    assert set(ids) == {"word_ids"}
    word_ids = ids["word_ids"].numpy()
    np.testing.assert_array_equal(word_ids, REF["token_ids"])
    unknown = WORDS.index("<UNK>") + 1
    for b, sentence in enumerate(SENTENCES):
        expected = [WORDS.index(w) + 1 if w in WORDS else unknown for w in sentence]
        assert list(word_ids[b, 1 : len(sentence) + 1]) == expected
        assert word_ids[b, 0] == WORDS.index("<S>") + 1 and word_ids[b, len(sentence) + 1] == WORDS.index("</S>") + 1
        assert np.all(word_ids[b, len(sentence) + 2 :] == 0)


def test_unknown_words_are_unk(models):
    bilm = models["explicit"]
    ids = inputs(bilm, [["fox", "zzz-never-seen", "The", "the", "<UNK>"]])["word_ids"].numpy()[0]
    unk = WORDS.index("<UNK>") + 1
    assert list(ids) == [1, unk, unk, WORDS.index("The") + 1, WORDS.index("the") + 1, unk, 2]  # case-sensitive
    out = bilm(inputs(bilm, [["fox", "zzz-never-seen"], ["<UNK>", "<UNK>"]]))
    for layer in out["layers"]:  # unknown words are <UNK>: the outputs are those of <UNK>
        np.testing.assert_allclose(layer.numpy()[0], layer.numpy()[1], atol=1e-6)


def one_line(error) -> str:
    text = str(error.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize("missing, flag", [("embedding.hdf5", "--embedding_file"), ("vocab.txt", "--vocab_file")])
def test_missing_table_or_vocabulary_beside_the_weights(missing, flag, tmp_path):
    for name in ("options.json", "weights.hdf5", "embedding.hdf5", "vocab.txt"):
        if name != missing:
            shutil.copy(DIR / name, tmp_path / name)
    with pytest.raises(WeightFileError) as caught:
        load_original(str(tmp_path / "options.json"), str(tmp_path / "weights.hdf5"))
    text = one_line(caught)
    assert "word-input biLM" in text and flag in text and f"no {missing} beside the weight file" in text


def test_missing_explicit_embedding_file(tmp_path):
    path = str(tmp_path / "nowhere.hdf5")
    with pytest.raises(WeightFileError) as caught:
        load_original(OPTIONS, WEIGHTS, embedding_file=path, vocab_file=VOCAB)
    assert path in one_line(caught) and "does not exist" in one_line(caught)


def test_embedding_file_without_the_table(tmp_path):
    path = tmp_path / "embedding.hdf5"
    shutil.copy(WEIGHTS, path)  # an HDF5 file, but the LSTM's
    with pytest.raises(WeightFileError) as caught:
        load_original(OPTIONS, WEIGHTS, embedding_file=str(path), vocab_file=VOCAB)
    assert str(path) in one_line(caught) and "'embedding'" in one_line(caught)


def test_a_vocabulary_of_another_size_is_refused_naming_both_sizes(tmp_path):
    """vocab.txt one word short of the 56-row table (the options leave the size to the vocabulary)."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(WORDS[:-1]) + "\n", encoding="utf-8")
    with pytest.raises(WeightFileError) as caught:
        load_original(OPTIONS, WEIGHTS, embedding_file=EMBEDDING, vocab_file=str(vocab))
    text = one_line(caught)
    assert "56" in text and "55" in text and EMBEDDING in text, text
    assert "vocab.txt" in text and "options require" not in text, text  # the vocabulary is blamed, not the options


def test_a_vocabulary_disagreeing_with_n_tokens_vocab_is_refused_naming_both_sizes(tmp_path):
    options = tmp_path / "options.json"
    options.write_text((DIR / "options.json").read_text().replace('"lstm"', '"n_tokens_vocab": 57, "lstm"', 1))
    with pytest.raises(WeightFileError) as caught:
        load_original(str(options), WEIGHTS, embedding_file=EMBEDDING, vocab_file=VOCAB)
    text = one_line(caught)
    assert "56 entries" in text and "57 rows" in text, text
