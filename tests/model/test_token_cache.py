"""The token cache (`build_token_cache`) on tests/fixtures/tiny_token_cache: tiny's character biLM, its vocab.txt, and
bilm-tf's `dump_token_embeddings` output for that vocabulary (`embedding.hdf5`).

The original's token-input mode turns an unknown word into `<UNK>`; ours looks known tokens up and still runs the
character CNN on the others, so a cached model gives the character path's outputs on every token (the reference's
`lm_embeddings_chars`), not the token path's (`lm_embeddings`) where a sentence has an unknown word.

What dump_token_embeddings writes for `<S>` and `</S>`: bilm-tf's UnicodeCharsVocabulary gives the vocabulary's
`<S>` / `</S>` the sentence-boundary character rows ([259, 257 | 258, 260, 261, ...]), not the bytes of the five-
and six-letter strings, so rows 0 and 1 of the file are the BOS / EOS slots' token embeddings. Our encoders map the
tokens `<S>` / `</S>` the same way (`char_ids.token_char_ids`), so the cache's rows 0 and 1 equal the file's
(checked below, together with: the literal bytes would give other rows). `<UNK>` is an ordinary string there.
"""

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.errors import ConfigError
from elmo_tf.model.bilm import char_keys
from elmo_tf.model.token_cache import build_token_cache
from elmo_tf.model.weights_io import load_original, read_word_table
from elmo_tf.text.vocab import Vocabulary
from tests.conftest import FIXTURES

TOL = 1e-5
DIR = FIXTURES / "tiny_token_cache"
REF = dict(np.load(DIR / "reference.npz"))
SENTENCES = [line.split() for line in (DIR / "sentences.txt").read_text(encoding="utf-8").splitlines()]
WORDS = tuple(Vocabulary.from_file(str(DIR / "vocab.txt")).words)
LONG = "Pneumonoultramicroscopicsilicovolcanoconiosis-and-then-some-more-characters"  # in vocab.txt, > 48 bytes


def load():
    return load_original(str(DIR / "options.json"), str(DIR / "weights.hdf5"))


@pytest.fixture(scope="module")
def plain():
    return load()


@pytest.fixture(scope="module")
def cached():
    bilm = load()
    bilm.token_cache = build_token_cache(bilm, WORDS)
    return bilm


def run(bilm, sentences=SENTENCES):
    return bilm(bilm.encoder.sentences(tf.ragged.constant(sentences, dtype=tf.string, ragged_rank=1)))


def test_the_sentences_have_unknown_tokens_and_the_cache_is_used_for_the_others(cached):
    tokens = [t for s in SENTENCES for t in s]
    unknown = [t for t in tokens if t not in WORDS]
    assert len(unknown) >= 5 and any(len(t.encode()) > 48 for t in unknown)  # "aééé…", cut inside a character
    rows = cached.token_cache.lookup(char_keys(cached.encoder.tokens(tf.constant(tokens))["char_ids"])).numpy()
    assert [t for t, r in zip(tokens, rows) if r < 0] == unknown
    assert all(cached.token_cache.tokens[r] == t for t, r in zip(tokens, rows) if r >= 0)


def test_cached_equals_uncached_on_every_token(plain, cached):
    ours, theirs = run(cached), run(plain)
    slots = REF["token_ids"] > 0  # every slot holding a token, <S> / </S> included, unknown tokens included
    assert "token_embeddings" in ours
    err = np.abs(ours["token_embeddings"].numpy() - theirs["token_embeddings"].numpy())[slots].max()
    assert err < 1e-6, err
    np.testing.assert_array_equal(ours["mask"].numpy(), theirs["mask"].numpy())
    for k, (a, b) in enumerate(zip(ours["layers"], theirs["layers"], strict=True)):
        # The cached rows were computed in a batch of 56 tokens, the uncached ones in this batch's: they differ in
        # the last bits (float reassociation), a few units in the last place after the LSTMs (|values| <= 3).
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6, rtol=1e-6, err_msg=f"layer {k}")


def test_cached_matches_the_originals_character_path(cached):
    out = run(cached)
    mask = REF["mask"]
    np.testing.assert_array_equal(out["mask"].numpy(), mask)
    for k, layer in enumerate(out["layers"]):
        err = np.abs(layer.numpy() - REF["lm_embeddings_chars"][:, k])[mask].max()
        assert err < TOL, f"layer {k}: {err}"
    elmo = np.mean([layer.numpy() for layer in out["layers"]], axis=0)
    assert np.abs(elmo - REF["elmo_chars"])[mask].max() < TOL
    # ... and the original's token path only on sentences without an unknown word (it turns them into <UNK>).
    unk = WORDS.index("<UNK>") + 1
    known = ~np.any(REF["token_ids"] == unk, axis=1)
    assert 0 < known.sum() < len(SENTENCES)
    for k, layer in enumerate(out["layers"]):
        err = np.abs(layer.numpy() - REF["lm_embeddings"][:, k])[known][mask[known]].max()
        assert err < TOL, f"layer {k}: {err}"


def test_cache_vectors_are_the_originals_dumped_token_embeddings(plain, cached):
    cache, table = cached.token_cache, read_word_table(str(DIR / "embedding.hdf5"))
    assert cache.tokens == list(WORDS) and cache.size == len(WORDS) == table.shape[0]
    assert cache.vectors.shape == table.shape == (len(WORDS), cached.config.lstm.projection_dim)
    assert not cache.vectors.trainable
    np.testing.assert_allclose(cache.vectors.numpy(), table, atol=TOL, rtol=0)
    # <S> / </S> rows: the sentence-boundary character rows, not the strings' bytes (see the module docstring).
    def byte_row(token):
        row = [259] + [b + 1 for b in token.encode()] + [260]
        return row + [261] * (50 - len(row))

    literal = plain.char_features(tf.constant([byte_row("<S>"), byte_row("</S>")])).numpy()
    assert np.abs(literal - table[:2]).max(axis=1).min() > 0.1


def test_a_word_input_bilm_refuses_a_token_cache():
    folder = FIXTURES / "tiny_word_input"
    bilm = load_original(str(folder / "options.json"), str(folder / "weights.hdf5"))
    with pytest.raises(ConfigError, match="reads no characters"):
        build_token_cache(bilm, WORDS)


def test_tokens_with_the_same_first_bytes_share_one_entry(plain):
    variant = LONG[:48] + "-but-another-ending"  # the same first C - 2 = 48 bytes
    cache = build_token_cache(plain, [LONG, "a", variant, "a", "b"])
    assert cache.tokens == [LONG, "a", "b"] and cache.size == 3 and cache.vectors.shape == (3, 16)
    ids = plain.encoder.tokens(tf.constant([LONG, variant, "c"]))["char_ids"]
    assert list(cache.lookup(char_keys(ids)).numpy()) == [0, 0, -1]

    bilm = load()
    bilm.token_cache = cache
    sentences = [[variant, "a", "c"], [LONG]]
    ours, theirs = run(bilm, sentences), run(plain, sentences)
    for a, b in zip(ours["layers"], theirs["layers"], strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6, rtol=1e-6)

    # The cached rows are what the model reads: change one and only its token changes.
    cache.vectors.assign(tf.tensor_scatter_nd_update(cache.vectors, [[0]], tf.zeros([1, 16])))
    changed = run(bilm, sentences)["token_embeddings"].numpy()
    assert np.all(changed[0, 1] == 0.0) and np.all(changed[1, 1] == 0.0)  # `variant` and LONG: the zeroed row
    np.testing.assert_allclose(changed[0, 2:4], ours["token_embeddings"].numpy()[0, 2:4], atol=1e-6)  # "a", "c"


def test_empty_vocabulary_is_refused(plain):
    with pytest.raises(ConfigError, match="at least one token"):
        build_token_cache(plain, [])
