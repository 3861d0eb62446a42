import concurrent.futures
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from elmo_tf.text.vocab import Vocabulary, VocabError, build_vocab_file, coverage

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write(path, text: str, encoding="utf-8"):
    path.write_bytes(text.encode(encoding) if isinstance(text, str) else text)
    return str(path)


@pytest.fixture
def corpus(tmp_path):
    # counts: the 5, b 3, a 3, 北京 2, c 1, zeta 1; "<S>", "</S>", "<UNK>" in the text are not counted.
    write(tmp_path / "part-0.txt", "the a b\n\n  the  b 北京\n<S> the </S>\n")
    write(tmp_path / "part-1.txt", "a the c\n<UNK> b a\tthe 北京 zeta\n")
    write(tmp_path / "notes.md", "ignored ignored ignored\n")
    return str(tmp_path / "part-*.txt")


def test_build_orders_by_count_then_word(corpus, tmp_path):
    vocab = Vocabulary.build(corpus)
    assert vocab.words == ["<S>", "</S>", "<UNK>", "the", "a", "b", "北京", "c", "zeta"]
    assert vocab.size == len(vocab) == 9
    assert (vocab.BOS_ID, vocab.EOS_ID, vocab.UNK_ID) == (0, 1, 2)
    vocab.to_file(str(tmp_path / "vocab.txt"))
    assert (tmp_path / "vocab.txt").read_text("utf-8") == "<S>\n</S>\n<UNK>\nthe\na\nb\n北京\nc\nzeta\n"


def test_max_size_counts_the_special_tokens_and_min_count(corpus):
    assert Vocabulary.build(corpus, max_size=5).words == ["<S>", "</S>", "<UNK>", "the", "a"]
    assert Vocabulary.build(corpus, max_size=3).words == ["<S>", "</S>", "<UNK>"]
    assert Vocabulary.build(corpus, max_size=100).size == 9
    assert Vocabulary.build(corpus, min_count=2).words == ["<S>", "</S>", "<UNK>", "the", "a", "b", "北京"]
    assert Vocabulary.build(corpus, max_size=5, min_count=4).words == ["<S>", "</S>", "<UNK>", "the"]
    with pytest.raises(VocabError, match="max_size .* >= 3 .* received 2"):
        Vocabulary.build(corpus, max_size=2)
    with pytest.raises(VocabError, match="min_count must be >= 1; received 0"):
        Vocabulary.build(corpus, min_count=0)


def test_counts_and_coverage(corpus):
    counts = Vocabulary.count_words(corpus)
    assert dict(counts) == {"the": 5, "a": 3, "b": 3, "北京": 2, "c": 1, "zeta": 1}
    vocab = Vocabulary.from_counts(counts, max_size=5)  # the, a
    assert coverage(vocab, counts) == pytest.approx(8 / 15)


def test_build_errors_name_the_pattern_or_file(tmp_path):
    with pytest.raises(VocabError, match=r"No corpus file matches the pattern '.*nothing-\*\.txt'"):
        Vocabulary.build(str(tmp_path / "nothing-*.txt"))
    bad = write(tmp_path / "latin1.txt", "ok line\ncaf\xe9\n", encoding="latin-1")
    with pytest.raises(VocabError, match=r"latin1\.txt' is not valid UTF-8 at line 2"):
        Vocabulary.build(bad)


def test_round_trip_is_atomic_and_exact(tmp_path, corpus):
    vocab = Vocabulary.build(corpus)
    path = tmp_path / "out" / "vocab.txt"
    write_dir = path.parent
    vocab.to_file(str(path))
    Vocabulary(["<S>", "</S>", "<UNK>", "x"]).to_file(str(path))  # replaces the file
    assert Vocabulary.from_file(str(path)).words == ["<S>", "</S>", "<UNK>", "x"]
    vocab.to_file(str(path))
    assert Vocabulary.from_file(str(path)).words == vocab.words
    assert sorted(os.listdir(write_dir)) == ["vocab.txt"]  # no temporary file left behind


def test_from_file_rejects_a_directory(tmp_path):
    with pytest.raises(VocabError, match="is a directory"):
        Vocabulary.from_file(str(tmp_path))


def test_from_file_accepts_crlf_and_no_final_newline(tmp_path):
    assert Vocabulary.from_file(write(tmp_path / "v1", "<S>\r\n</S>\r\n<UNK>\r\nword\r\n")).words[-1] == "word"
    assert Vocabulary.from_file(write(tmp_path / "v2", "<S>\n</S>\n<UNK>\nword")).size == 4


@pytest.mark.parametrize(
    "content, message",
    [
        (None, r"'.*vocab.txt' does not exist"),
        (b"<S>\n</S>\n<UNK>\ncaf\xe9\n", r"'.*vocab.txt' is not valid UTF-8: byte 18 \(line 4\)"),
        ("", r"'.*vocab.txt' is empty; it must start with <S>, </S>, <UNK>"),
        ("\n\n", r"is empty"),
        ("the\n<S>\n</S>\n<UNK>\n", r"line 1 must be '<S>' but is 'the'; .* must start with <S>, </S>, <UNK>"),
        ("<S>\n<UNK>\n</S>\nthe\n", r"line 2 must be '</S>' but is '<UNK>'"),
        ("<S>\n</S>\n", r"at least the 3 special tokens .* found only 2 line"),
        ("<S>\n</S>\n<UNK>\nthe\na\nthe\n", r"the word 'the' appears twice, at lines 4 and 6"),
        ("<S>\n</S>\n<UNK>\nthe\n<S>\n", r"the word '<S>' appears twice, at lines 1 and 5"),
        ("<S>\n</S>\n<UNK>\nnew york\n", r"line 4 contains whitespace: 'new york'"),
        ("<S>\n</S>\n<UNK>\n the\n", r"line 4 contains whitespace: ' the'"),
        ("<S>\n</S>\n<UNK>\na\n\nb\n", r"line 5 is empty"),
    ],
)
def test_from_file_errors(tmp_path, content, message):
    path = tmp_path / "vocab.txt"
    if content is not None:
        write(path, content)
    with pytest.raises(VocabError, match=message):
        Vocabulary.from_file(str(path))


def test_constructor_validates():
    with pytest.raises(VocabError, match="position 1 must be '<S>'"):
        Vocabulary(["a", "b", "c"])
    with pytest.raises(VocabError, match="'x' appears twice, at positions 4 and 5"):
        Vocabulary(["<S>", "</S>", "<UNK>", "x", "x"])


def test_id_of_and_lookup_table():
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", "the", "北京"])
    assert [vocab.id_of(w) for w in ["<S>", "</S>", "<UNK>", "the", "北京", "unseen", ""]] == [0, 1, 2, 3, 4, 2, 2]
    assert "the" in vocab and "unseen" not in vocab
    table = vocab.lookup_table()
    assert vocab.lookup_table() is table  # built once
    words = tf.constant([["the", "unseen"], ["北京", "</S>"]])
    ids = table.lookup(words)
    assert ids.dtype == tf.int32
    np.testing.assert_array_equal(ids.numpy(), [[3, 2], [4, 1]])
    ds = tf.data.Dataset.from_tensor_slices(words).map(table.lookup)
    np.testing.assert_array_equal(np.stack(list(ds.as_numpy_iterator())), [[3, 2], [4, 1]])


def test_build_vocab_file(corpus, tmp_path):
    vocab, covered = build_vocab_file(corpus, str(tmp_path / "v.txt"), max_size=4)
    assert vocab.words == ["<S>", "</S>", "<UNK>", "the"]
    assert covered == pytest.approx(5 / 15)
    assert Vocabulary.from_file(str(tmp_path / "v.txt")).words == vocab.words


@pytest.mark.slow
def test_command_line(corpus, tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)

    def command(name: str, *flags: str) -> list[str]:
        return [sys.executable, "-m", "elmo_tf.vocab", f"--train_prefix={corpus}", f"--vocab_file={tmp_path / name}",
                *flags]

    # --vocab_size, train.py's name, cuts the vocabulary; --max_size, its earlier name here, is the same flag.
    runs = {"min_count": command("vocab.txt", "--min_count=2"), "bad": command("bad.txt", "--min_count=0"),
            "--vocab_size=5": command("vocab_size.txt", "--min_count=2", "--vocab_size=5"),
            "--max_size=5": command("max_size.txt", "--min_count=2", "--max_size=5")}
    # Each run imports TensorFlow (elmo_tf/text/vocab.py does) and writes its own file: all start at once.
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(runs)) as pool:
        futures = {name: pool.submit(subprocess.run, argv, env=env, capture_output=True, text=True, timeout=120)
                   for name, argv in runs.items()}
        results = {name: future.result() for name, future in futures.items()}
    result = results["min_count"]
    assert result.returncode == 0, result.stderr
    words = Vocabulary.from_file(str(tmp_path / "vocab.txt")).words
    assert words == ["<S>", "</S>", "<UNK>", "the", "a", "b", "北京"]
    assert "7 words" in result.stderr and "86.67% of the corpus tokens" in result.stderr
    bad = results["bad"]
    assert bad.returncode != 0 and "--min_count=0: 0 is not a positive integer" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr
    assert not (tmp_path / "bad.txt").exists()
    for flag, name in (("--vocab_size=5", "vocab_size.txt"), ("--max_size=5", "max_size.txt")):
        result = results[flag]
        assert result.returncode == 0, result.stderr
        assert Vocabulary.from_file(str(tmp_path / name)).words == ["<S>", "</S>", "<UNK>", "the", "a"], flag
