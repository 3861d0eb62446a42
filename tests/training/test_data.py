"""elmo_tf.training.data against a plain-Python statement of the original recipe (bilm-tf `_get_batch`)."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.training import data
from elmo_tf.text.vocab import Vocabulary

C = 12  # chars per token: every test word has at most C - 2 = 10 bytes, so char ids decode losslessly
KEYS = tuple(f"{kind}_{way}" for way in ("forward", "backward") for kind in ("char_ids", "targets", "weights"))

SHARDS = {
    "shard-0.txt": [
        "the cat sat on the mat",
        "",
        "a dog",
        "   ",
        "the end",
        "un deux trois quatre cinq six sept huit neuf dix onze douze treize",  # 13 words > 3U
    ],
    "shard-1.txt": [
        "north wind über café",
        "the",
        "北京 is a city",
        "cat and dog and cat",
        "zzz rare words here",
    ],
}


def write_corpus(directory, shards=SHARDS) -> str:
    for name, lines in shards.items():
        (directory / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(directory / "shard-*.txt")


def corpus_sentences(shards=SHARDS) -> list[list[str]]:
    """Sentences in corpus order: files sorted by name, blank lines skipped."""
    return [line.split() for name in sorted(shards) for line in shards[name] if line.split()]


def make_vocab(shards=SHARDS) -> Vocabulary:
    """A vocabulary that leaves some corpus words out, so that targets hit <UNK>."""
    counts = collections.Counter(w for s in corpus_sentences(shards) for w in s)
    return Vocabulary.from_counts(counts, max_size=12)


def python_char_ids(token: str) -> list[int]:
    if token == "<S>":
        return [259, 257, 260] + [261] * (C - 3)
    if token == "</S>":
        return [259, 258, 260] + [261] * (C - 3)
    data_bytes = token.encode("utf-8")[: C - 2]
    return [259] + [b + 1 for b in data_bytes] + [260] + [261] * (C - 2 - len(data_bytes))


def decode(row: np.ndarray):
    """Char ids of one token -> its text; None for a padding slot (all zeros)."""
    if not row.any():
        return None
    assert row[0] == 259, row
    if row[1] in (257, 258) and row[2] == 260:
        return "<S>" if row[1] == 257 else "</S>"
    end = list(row).index(260)
    return bytes(int(x) - 1 for x in row[1:end]).decode("utf-8")


def stream_windows(sentences, batch_size, unroll_steps, reverse=False, flush=False):
    """One direction's windows in plain Python, one sentence at a time.

    Returns the windows (each B rows of U (input, target) pairs, None for padding) and the most pairs a
    row ever held pending.
    """
    rows = [[] for _ in range(batch_size)]
    windows, most_pending = [], 0
    for words in sentences:
        if reverse:
            pairs = list(zip(["</S>"] + words[::-1], words[::-1] + ["<S>"]))
        else:
            pairs = list(zip(["<S>"] + words, words + ["</S>"]))
        row = min(range(batch_size), key=lambda b: (len(rows[b]), b))
        rows[row].extend(pairs)
        most_pending = max(most_pending, len(rows[row]))
        while min(len(r) for r in rows) >= unroll_steps:
            windows.append([r[:unroll_steps] for r in rows])
            rows = [r[unroll_steps:] for r in rows]
    while flush and any(rows):
        windows.append([r[:unroll_steps] + [None] * (unroll_steps - len(r[:unroll_steps])) for r in rows])
        rows = [r[unroll_steps:] for r in rows]
    return windows, most_pending


def reference(sentences, batch_size, unroll_steps, flush=False, backward_sentences=None):
    """The recipe in plain Python: the forward stream reads `sentences`, the backward stream (each sentence
    reversed) reads `backward_sentences` (default: the same, as both do in file order).

    Returns the windows (each B rows of U (fw input, fw target, bw input, bw target) pairs, None for
    padding) and the most pairs a forward row ever held pending.
    """
    forward, most_pending = stream_windows(sentences, batch_size, unroll_steps, flush=flush)
    backward, _ = stream_windows(
        sentences if backward_sentences is None else backward_sentences, batch_size, unroll_steps, True, flush
    )
    windows = [
        [[(f or (None, None)) + (b or (None, None)) for f, b in zip(fw_row, bw_row)]
         for fw_row, bw_row in zip(fw, bw)]
        for fw, bw in zip(forward, backward)
    ]
    return windows, most_pending


def expected_batches(windows, vocab):
    batches = []
    for window in windows:
        batch = {}
        for direction, (inp, tgt) in (("forward", (0, 1)), ("backward", (2, 3))):
            batch[f"char_ids_{direction}"] = np.array(
                [[python_char_ids(p[inp]) if p[inp] else [0] * C for p in row] for row in window], np.int32
            )
            batch[f"targets_{direction}"] = np.array(
                [[vocab.id_of(p[tgt]) if p[tgt] else 0 for p in row] for row in window], np.int32
            )
            batch[f"weights_{direction}"] = np.array([[1.0 if p[tgt] else 0.0 for p in row] for row in window], np.float32)
        batches.append(batch)
    return batches


def collect(dataset, n=None):
    iterator = dataset.as_numpy_iterator()
    return list(iterator) if n is None else [next(iterator) for _ in range(n)]


def assert_batches_equal(got, expected):
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert sorted(g) == sorted(KEYS)
        for key in KEYS:
            np.testing.assert_array_equal(g[key], e[key], err_msg=f"batch {i}, {key}")


def row_tokens(batches, key):
    """Each row's decoded input stream (char ids -> text), windows concatenated; padding dropped."""
    chars = np.concatenate([b[key] for b in batches], axis=1)  # [B, windows * U, C]
    return [[t for t in (decode(c) for c in row) if t is not None] for row in chars]


def split_sentences(stream, start):
    """An input stream `<S> w.. <S> w..` (or `</S> w..`) -> its sentences; the last one may be cut."""
    sentences = []
    for token in stream:
        if token == start:
            sentences.append([])
        else:
            sentences[-1].append(token)
    return sentences


def stream_orders(pattern, vocab, n_epochs, seed, shuffle_buffer, corpus):
    """The sentence orders of the forward and the backward stream, read off a one-row run of the pipeline.

    With one row, a stream is its sentences one after the other; the last one may be cut by the dropped
    tail and is completed from `corpus` (the sentence of the last epoch not seen yet).
    """
    ds = data.lm_windows(
        pattern, vocab, batch_size=1, unroll_steps=5, max_chars=C, n_epochs=n_epochs, seed=seed, shuffle_buffer=shuffle_buffer
    )
    got = collect(ds)
    orders = []
    for key, start in (("char_ids_forward", "<S>"), ("char_ids_backward", "</S>")):
        sentences = split_sentences(row_tokens(got, key)[0], start)
        if start == "</S>":
            sentences = [s[::-1] for s in sentences]
        last_epoch = sentences[(n_epochs - 1) * len(corpus) : -1]
        missing = [s for s in corpus if s not in last_epoch]
        assert len(sentences) == n_epochs * len(corpus) and len(missing) == 1
        orders.append(sentences[:-1] + missing)
    return orders


def test_element_spec_static_shapes(tmp_path):
    ds = data.lm_windows(write_corpus(tmp_path), make_vocab(), batch_size=3, unroll_steps=4, max_chars=C)
    spec = ds.element_spec
    assert sorted(spec) == sorted(KEYS)
    for direction in ("forward", "backward"):
        assert spec[f"char_ids_{direction}"] == tf.TensorSpec([3, 4, C], tf.int32)
        assert spec[f"targets_{direction}"] == tf.TensorSpec([3, 4], tf.int32)
        assert spec[f"weights_{direction}"] == tf.TensorSpec([3, 4], tf.float32)


def test_windows_follow_the_recipe_in_corpus_order(tmp_path):
    """Rows, order, next-token targets, <UNK>, reversal, char ids and the dropped tail, two epochs."""
    vocab = make_vocab()
    pattern = write_corpus(tmp_path)
    ds = data.lm_windows(pattern, vocab, batch_size=3, unroll_steps=4, max_chars=C, n_epochs=2, shuffle=False)
    got = collect(ds)
    windows, _ = reference(corpus_sentences() * 2, 3, 4)
    assert len(windows) == 8  # 100 pairs over 2 epochs, 12 per window: one partial window dropped
    assert_batches_equal(got, expected_batches(windows, vocab))
    assert any((b["targets_forward"] == Vocabulary.UNK_ID).any() for b in got)  # OOV targets are <UNK>

    # Independently of the reference: decoding the char ids gives back the corpus text.
    forward = row_tokens(got, "char_ids_forward")
    backward = row_tokens(got, "char_ids_backward")
    corpus = [" ".join(s) for s in corpus_sentences()]
    complete = []
    for fw_row, bw_row in zip(forward, backward):
        fw_sentences = split_sentences(fw_row, "<S>")
        bw_sentences = split_sentences(bw_row, "</S>")
        assert [s[::-1] for s in fw_sentences[:-1]] == bw_sentences[:-1]  # backward = each sentence reversed
        complete += [" ".join(s) for s in fw_sentences[:-1]]
        for sentence in fw_sentences:
            assert any(line.startswith(" ".join(sentence)) for line in corpus)
    counts = collections.Counter(complete)
    assert set(counts) <= set(corpus) and max(counts.values()) <= 2
    # Targets are the next tokens: inside a sentence the next input, at its end </S>.
    for b in got:
        for row_chars, row_targets in zip(b["char_ids_forward"], b["targets_forward"]):
            tokens = [decode(c) for c in row_chars]
            for t in range(len(tokens) - 1):
                following = "</S>" if tokens[t + 1] == "<S>" else tokens[t + 1]
                assert row_targets[t] == vocab.id_of(following)


@pytest.mark.slow
@pytest.mark.parametrize("shuffle_buffer", [None, 4])
def test_shuffled_epochs_hold_every_sentence_once_each(tmp_path, shuffle_buffer):
    """Each epoch: every sentence once, files one after the other, each file's lines shuffled as a whole (or in
    blocks of shuffle_buffer lines); reshuffled each epoch; the backward stream shuffled independently."""
    lines = [f"s{i} w{i % 3}" for i in range(40)]  # one sentence per line, no blank lines
    shards = {"shard-0.txt": lines[:24], "shard-1.txt": lines[24:]}
    pattern = write_corpus(tmp_path, shards)
    corpus = corpus_sentences(shards)
    vocab = Vocabulary.from_counts(collections.Counter(w for s in corpus for w in s))
    n = len(corpus)
    forward, backward = stream_orders(pattern, vocab, 3, 7, shuffle_buffer, corpus)
    for order in (forward, backward):
        epochs = [order[i * n : (i + 1) * n] for i in range(3)]
        for epoch in epochs:
            assert sorted(map(tuple, epoch)) == sorted(map(tuple, corpus))  # each epoch: every sentence once
            index = [corpus.index(s) for s in epoch]
            first_file = index[0] < 24
            file_of = [i < 24 for i in index]
            assert file_of == [first_file] * (24 if first_file else 16) + [not first_file] * (16 if first_file else 24)
            if shuffle_buffer:
                # a block of 4 lines of a file is read as 4 consecutive lines of the stream
                for offset in range(0, n, 4):
                    group = index[offset : offset + 4]
                    assert len({(i < 24, (i if i < 24 else i - 24) // 4) for i in group}) == 1
            else:  # the whole file is one block: lines far apart in the file meet early in the stream
                assert max(abs(a - b) for a, b in zip(index, index[1:])) > 8
        assert epochs[0] != epochs[1] != epochs[2] and epochs[0] != corpus  # reshuffled each epoch
    assert forward[:n] != backward[:n]  # the two directions read independent orders

    ds = data.lm_windows(
        pattern, vocab, batch_size=2, unroll_steps=5, max_chars=C, n_epochs=3, seed=7, shuffle_buffer=shuffle_buffer
    )
    windows, _ = reference(forward, 2, 5, backward_sentences=backward)
    assert_batches_equal(collect(ds), expected_batches(windows, vocab))


@pytest.mark.slow
def test_same_seed_same_batches_other_seed_differs(tmp_path):
    pattern, vocab = write_corpus(tmp_path), make_vocab()

    def first(seed):
        ds = data.lm_windows(pattern, vocab, batch_size=2, unroll_steps=3, max_chars=C, seed=seed, shuffle_buffer=3)
        return collect(ds, 12)

    a = first(1)
    tf.random.set_seed(1234)  # the global seed plays no part
    try:
        assert_batches_equal(first(1), a)
    finally:
        tf.random.set_seed(None)
    b = first(2)
    assert any(not np.array_equal(x["targets_forward"], y["targets_forward"]) for x, y in zip(a, b))


@pytest.mark.slow
def test_checkpointed_iterator_resumes_exactly(tmp_path):
    pattern = write_corpus(tmp_path)

    def dataset():  # built anew, as in a restarted process
        vocab = make_vocab()
        return data.lm_windows(pattern, vocab, batch_size=2, unroll_steps=3, max_chars=C, seed=3, shuffle_buffer=4)

    def take(iterator, n):
        return [{key: v.numpy() for key, v in next(iterator).items()} for _ in range(n)]

    iterator = iter(dataset())
    saved, uninterrupted = {}, []
    for k in (4, 11):  # 8 batches per epoch: a save in the first epoch and one in the second
        uninterrupted += take(iterator, k - len(uninterrupted))
        saved[k] = tf.train.Checkpoint(iterator=iterator).save(str(tmp_path / "ckpt" / f"after-{k}"))
    uninterrupted += take(iterator, 41 - len(uninterrupted))

    for k, path in saved.items():
        restored = iter(dataset())
        tf.train.Checkpoint(iterator=restored).restore(path).assert_consumed()
        assert_batches_equal(take(restored, 30), uninterrupted[k : k + 30])  # across several epochs


def test_heldout_counts_every_token_once(tmp_path):
    vocab = make_vocab()
    ds = data.heldout_windows(write_corpus(tmp_path), vocab, batch_size=3, unroll_steps=4, max_chars=C)
    got = collect(ds)
    windows, _ = reference(corpus_sentences(), 3, 4, flush=True)
    assert_batches_equal(got, expected_batches(windows, vocab))

    n_tokens = sum(len(s) + 1 for s in corpus_sentences())  # n words + </S> per sentence
    for direction in ("forward", "backward"):
        assert sum(b[f"weights_{direction}"].sum() for b in got) == n_tokens
    assert got[-1]["weights_forward"].min() == 0  # the last window is padded
    sentences = [s for row in row_tokens(got, "char_ids_forward") for s in split_sentences(row, "<S>")]
    assert sorted(map(tuple, sentences)) == sorted(map(tuple, corpus_sentences()))  # all, once, whole


def test_sentence_longer_than_three_windows(tmp_path):
    long = [f"w{i}" for i in range(17)]
    shards = {"shard-0.txt": ["a b", " ".join(long)] + ["c d e"] * 8}
    vocab = Vocabulary.from_counts(collections.Counter(w for s in corpus_sentences(shards) for w in s))
    pattern = write_corpus(tmp_path, shards)
    ds = data.lm_windows(pattern, vocab, batch_size=2, unroll_steps=4, max_chars=C, n_epochs=1, shuffle=False)
    got = collect(ds)
    windows, _ = reference(corpus_sentences(shards), 2, 4)
    assert_batches_equal(got, expected_batches(windows, vocab))
    # Row 1 carries the long sentence across 5 consecutive windows, token after token.
    assert len(got) == 6
    stream = row_tokens(got, "char_ids_forward")[1]
    assert stream[:19] == ["<S>"] + long + ["<S>"]
    targets = np.concatenate([b["targets_forward"][1] for b in got])
    assert targets[:18].tolist() == [vocab.id_of(w) for w in long + ["</S>"]]


@pytest.mark.slow
def test_rows_stay_balanced_on_a_skewed_corpus(tmp_path):
    long = " ".join(f"x{i}" for i in range(59))  # 60 pairs
    short = [" ".join(["s"] * (1 + i % 2)) for i in range(150)]  # 2 or 3 pairs each
    shards = {"shard-0.txt": [long] + short + [long] + short}
    B, U = 4, 5
    vocab = Vocabulary.from_counts(collections.Counter(w for s in corpus_sentences(shards) for w in s))
    pattern = write_corpus(tmp_path, shards)
    got = collect(data.lm_windows(pattern, vocab, batch_size=B, unroll_steps=U, max_chars=C, n_epochs=1, shuffle=False))
    windows, most_pending = reference(corpus_sentences(shards), B, U)
    assert_batches_equal(got, expected_batches(windows, vocab))
    assert most_pending <= U + 60  # shortest-row dealing: a row never holds more than U + one sentence
    # While row 0 works through the first long sentence, the short ones go to the other rows.
    streams = row_tokens(got, "char_ids_forward")
    assert streams[0][:60] == ["<S>"] + long.split()
    assert all(stream[:12].count("<S>") >= 4 for stream in streams[1:])
    lengths = [len(s) for s in streams]
    assert max(lengths) == min(lengths)  # every row filled the same number of windows


def test_blank_lines_and_padding_tokens_never_reach_the_rows(tmp_path):
    shards = {"a.txt": ["", " \t ", "x y", "\u3000", "z"]}
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", "x", "y", "z"])
    pattern = write_corpus(tmp_path, shards).replace("shard-*", "*")
    got = collect(data.heldout_windows(pattern, vocab, batch_size=1, unroll_steps=2, max_chars=C))
    assert [b["targets_forward"].tolist() for b in got] == [[[3, 4]], [[1, 5]], [[1, 0]]]
    assert [b["weights_forward"].tolist() for b in got] == [[[1, 1]], [[1, 1]], [[1, 0]]]
    assert not got[-1]["char_ids_forward"][0, 1].any()


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(batch_size=0), ValueError, r"`batch_size` must be an integer >= 1; received 0"),
        (dict(unroll_steps=0), ValueError, r"`unroll_steps` must be an integer >= 1; received 0"),
        (dict(unroll_steps=2.5), ValueError, r"`unroll_steps` must be an integer >= 1; received 2.5"),
        (dict(max_chars=2), ValueError, r"`max_chars` must be an integer >= 3; received 2"),
        (dict(n_epochs=0), ValueError, r"`n_epochs` must be None \(repeat forever\) or an integer >= 1; received 0"),
        (dict(shuffle_buffer=0), ValueError, r"`shuffle_buffer` must be None \(whole files\) or an integer >= 1; received 0"),
        (dict(seed="7"), ValueError, r"`seed` must be an integer; received '7'"),
        (dict(vocab=["<S>", "</S>", "<UNK>"]), TypeError, r"`vocab` must be an elmo_tf.text.vocab.Vocabulary; .* list"),
    ],
)
def test_argument_errors(tmp_path, kwargs, error, message):
    args = dict(file_pattern=write_corpus(tmp_path), vocab=make_vocab(), batch_size=2, unroll_steps=3, max_chars=C)
    args.update(kwargs)
    with pytest.raises(error, match=message):
        data.lm_windows(**args)


@pytest.mark.parametrize("make", [data.lm_windows, data.heldout_windows])
def test_corpus_errors_name_the_pattern(tmp_path, make):
    with pytest.raises(ValueError, match=r"No corpus file matches the pattern '.*/none-\*\.txt'"):
        make(str(tmp_path / "none-*.txt"), make_vocab(), batch_size=2, unroll_steps=3, max_chars=C)
    (tmp_path / "blank.txt").write_text("\n  \n\t\n")
    with pytest.raises(ValueError, match=r"'.*blank\.txt' hold no sentence: every line is blank"):
        make(str(tmp_path / "blank.txt"), make_vocab(), batch_size=2, unroll_steps=3, max_chars=C)


def test_gzipped_shards_give_the_same_windows_and_vocabulary(tmp_path):
    """A corpus stored as .gz files (as data/english_lm is) trains, evaluates and counts exactly as the plain one."""
    import gzip

    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir(), packed.mkdir()
    write_corpus(plain)
    for name, lines in SHARDS.items():
        (packed / f"{name}.gz").write_bytes(gzip.compress("".join(line + "\n" for line in lines).encode()))
    a, b = str(plain / "shard-*"), str(packed / "shard-*")
    vocab = make_vocab()
    assert Vocabulary.count_words(a) == Vocabulary.count_words(b)
    for make in (lambda p: data.lm_windows(p, vocab, batch_size=2, unroll_steps=3, max_chars=C, seed=1),
                 lambda p: data.lm_windows(p, vocab, batch_size=2, unroll_steps=3, max_chars=C, seed=1, shuffle_buffer=3)):
        assert_batches_equal(collect(make(b), 12), collect(make(a), 12))
    for windows in (data.heldout_windows, data.sentence_windows):
        got, expected = (collect(windows(p, vocab, batch_size=3, unroll_steps=4, max_chars=C)) for p in (b, a))
        assert len(got) == len(expected) > 0
        for g, e in zip(got, expected):
            assert sorted(g) == sorted(e)
            for key in g:
                np.testing.assert_array_equal(g[key], e[key], err_msg=key)
