"""Corpus shards -> `tf.data` training windows for the bidirectional LM (the original bilm-tf recipe).

Corpus: a glob of text files, one whitespace-tokenized sentence per line (blank lines are skipped); files named
`*.gz` are read decompressed (gzip).

Pairs. Each sentence `w1 .. wn` gives n + 1 (input, target) pairs per direction, as the original's
`LMDataset` / `_get_batch`:
  forward   inputs `<S> w1 .. wn`    targets `w1 .. wn </S>`   (the sentence `<S> w1 .. wn </S>`)
  backward  inputs `</S> wn .. w1`   targets `wn .. w1 <S>`    (the same sentence reversed)
The last token of a sentence is only ever a target: the input after `wn` is the next sentence's
`<S>` (`</S>` backward), so no window asks to predict a sentence start from a sentence end.

Streams. As in the original's `BidirectionalLMDataset`, the forward and the backward LM read two
independent streams: each has its own shuffle of the files and of their lines, so a batch's backward
rows hold other sentences than its forward rows. (Held-out data is read in file order by both.)

Rows and windows. A batch has B rows. Each row is a stream of pairs, the concatenation of the
sentences dealt to it; window k of a row holds pairs [kU, kU + U) of its stream, so consecutive
windows of a row are contiguous and the trainer can carry each row's LSTM state from one window to
the next (truncated BPTT). Each sentence, in stream order, is dealt to the row with the fewest
pending pairs (ties: the lowest row), and a window is cut as soon as every row holds U pairs. Rows
stay balanced: a row never holds more than about U + (longest sentence + 1) + (pairs of one 64-line
chunk) / B pending pairs, whatever the mix of sentence lengths.

Pipeline (all tf.data, no Python iteration, so `tf.train.Checkpoint(iterator=iterator)` saves the
exact position: epoch, file offset, shuffled file, pending pairs), once per direction:
  epochs (range or counter) -> files (order shuffled per epoch) -> each file's lines (shuffled as a
  whole, like the original's shard) -> chunks of 64 lines -> pairs (parallel map) -> `scan` dealing
  sentences to rows and cutting windows; then both directions zipped -> char ids and target ids
  (parallel map) -> prefetch.
Shuffles are stateless functions of (seed, direction, epoch, file): deterministic, independent of any
global seed, and restored exactly from a checkpoint.

Shapes: B batch rows, U unroll steps, C chars per token, L longest pending row, P pairs in a chunk,
s sentences in a chunk, k windows cut in one scan step.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from elmo_tf.text import char_ids
from elmo_tf.text.encoders import ByteCharEncoder, TokenEncoder
from elmo_tf.text.vocab import Vocabulary
from elmo_tf.errors import CorpusError
from elmo_tf.utils.files import open_corpus

# Columns of a pair in the scan buffer.
_INPUT, _TARGET = range(2)
_NUM_COLUMNS = 2
# Shuffling a whole file: one block holds every line (block keys of a file stay apart below this many blocks).
_WHOLE_FILE = 1 << 62
_BLOCKS_PER_FILE = 1 << 32
# Lines handled per scan step: the per-element overhead of tf.data is paid per chunk, not per
# sentence. The windows do not depend on it (see `_window_scan`).
_CHUNK = 64


# The dataset functions have no Python control flow on tensors: skipping AutoGraph saves tracing time.
_plain = tf.autograph.experimental.do_not_convert


# The head of each corpus file is checked to be UTF-8 text, so that a binary file (a compressed corpus, a
# wrong glob) is refused at start instead of being trained on as bytes.
_HEAD_BYTES = 1 << 16


def _check_text_head(path: str) -> None:
    try:
        with open_corpus(path) as f:
            head = f.read(_HEAD_BYTES)
    except (OSError, EOFError) as e:  # a damaged .gz file
        raise CorpusError(f"Corpus file {path!r} cannot be read: {e}.") from None
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.reason == "unexpected end of data" and len(head) == _HEAD_BYTES:  # a character cut by the block end
            return
        line = head.count(b"\n", 0, e.start) + 1
        raise CorpusError(
            f"Corpus file {path!r} is not UTF-8 text: line {line} has the byte {head[e.start]:#04x}. Is it compressed "
            "or binary? Give text files, one tokenized sentence per line (gzip-compressed ones named *.gz)."
        ) from None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_args(file_pattern, vocab, batch_size, unroll_steps, max_chars, encoder=None) -> list[str]:
    """Validates the common arguments; returns the corpus files, sorted."""
    if not isinstance(vocab, Vocabulary):
        raise TypeError(f"`vocab` must be an elmo_tf.text.vocab.Vocabulary; received {type(vocab).__name__}.")
    if encoder is not None and not isinstance(encoder, TokenEncoder):
        raise TypeError(f"`encoder` must be an elmo_tf.text.encoders.TokenEncoder; received {type(encoder).__name__}.")
    if (encoder is None) == (max_chars is None):
        raise ValueError("Give the model's `encoder` (`bilm.encoder`) or, for a character biLM, `max_chars`.")
    minimums = (("batch_size", batch_size, 1), ("unroll_steps", unroll_steps, 1))
    if encoder is None:
        minimums += (("max_chars", max_chars, 3),)
    for name, value, low in minimums:
        if not _is_int(value) or value < low:
            raise ValueError(f"`{name}` must be an integer >= {low}; received {value!r}.")
    if not isinstance(file_pattern, str) or not file_pattern:
        raise ValueError(f"`file_pattern` must be a non-empty glob string; received {file_pattern!r}.")
    files = sorted(tf.io.gfile.glob(file_pattern))
    if not files:
        raise CorpusError(f"No corpus file matches the pattern {file_pattern!r}.")
    for path in files:
        _check_text_head(path)
    # Read up to the first sentence: with an all-blank corpus, endless epochs would spin forever.
    for path in files:
        with open_corpus(path) as f:
            if any(line.decode("utf-8", errors="replace").split() for line in f):
                return files
    raise CorpusError(f"The files matching {file_pattern!r} hold no sentence: every line is blank.")


def _chunk_pairs(lines: tf.Tensor, reverse: bool) -> dict[str, tf.Tensor]:
    """Lines string `[s]` -> the pairs of one direction for their non-blank sentences (s' of them, P pairs).

    A sentence `w1 .. wn` gives n + 1 (input, target) pairs: forward `<S> w1 .. wn` -> `w1 .. wn </S>`,
    backward (`reverse`) `</S> wn .. w1` -> `wn .. w1 <S>`. Returns `pairs` string `[P, 2]`, `sizes`
    int64 `[s']` (pairs per sentence), and for each pair its `sentence` (index in the chunk) and `offset`
    (index in its sentence), int64 `[P]`.
    """
    tokens = char_ids.split_whitespace(lines)  # [s, (n)]
    words = tokens.flat_values  # [N]
    n = tokens.row_lengths()  # [s]
    n = tf.boolean_mask(n, n > 0)  # [s']: blank lines dropped (they hold no words)
    sizes = n + 1  # [s']
    ends = tf.cumsum(sizes)  # [s']
    pair = tf.range(tf.reduce_sum(sizes))  # [P]
    sentence = tf.searchsorted(ends, pair, side="right", out_type=tf.int64)  # [P]
    offset = pair - tf.gather(ends - sizes, sentence)  # [P], j in 0..n
    first = tf.gather(tf.cumsum(n) - n, sentence)  # [P]: index in `words` of the sentence's w1
    length = tf.gather(n, sentence)  # [P]
    last_word = tf.maximum(tf.size(words, out_type=tf.int64) - 1, 0)

    def word(index, special, use_special):  # words[index], or `special` where use_special
        return tf.where(use_special, special, tf.gather(words, tf.clip_by_value(index, 0, last_word)))

    bos, eos = char_ids.BOS_TOKEN, char_ids.EOS_TOKEN
    if reverse:
        inputs = word(first + length - offset, eos, offset == 0)  # </S> wn .. w1
        targets = word(first + length - 1 - offset, bos, offset == length)  # wn .. w1 <S>
    else:
        inputs = word(first + offset - 1, bos, offset == 0)  # <S> w1 .. wn
        targets = word(first + offset, eos, offset == length)  # w1 .. wn </S>
    pairs = tf.stack([inputs, targets], axis=1)  # [P, 2]
    return {"pairs": pairs, "sizes": sizes, "sentence": sentence, "offset": offset, "is_end": tf.constant(False)}


def _text_lines(name: tf.Tensor) -> tf.data.Dataset:
    """The lines of one corpus file (a string tensor), gunzipped when the name ends in .gz."""
    gzipped = tf.strings.regex_full_match(name, r".*\.gz")
    return tf.data.TextLineDataset(name, compression_type=tf.where(gzipped, "GZIP", ""))


def _epoch_lines(
    files: list[str], epoch: tf.Tensor, *, shuffle: bool, seed: tf.Tensor, shuffle_buffer: Optional[int]
) -> tf.data.Dataset:
    """The lines of one epoch: the files in a shuffled order, each file's lines shuffled as a whole.

    As the original's `LMDataset(shuffle_on_load=True)`, which loads one shard at a time and shuffles all
    its sentences. With `shuffle_buffer`, each file is shuffled in consecutive blocks of that many lines
    instead (for shards too large for memory). Shuffling is stateless, from (seed, epoch):
    `Dataset.shuffle` inside the per-epoch function could not be checkpointed, and `repeat()` over a
    `reshuffle_each_iteration` shuffle does not reshuffle the later epochs identically once the iterator
    is restored from a checkpoint (TF 2.21).
    """
    names = tf.constant(files)  # [F]
    if not shuffle:
        return tf.data.Dataset.from_tensor_slices(names).flat_map(_plain(_text_lines))
    epoch_seed = tf.random.experimental.stateless_fold_in(seed, epoch, alg="philox")  # [2]

    def permute(values, key):  # Philox pinned, so that a saved position means the same on any machine
        key_seed = tf.random.experimental.stateless_fold_in(epoch_seed, key, alg="philox")
        return tf.random.experimental.stateless_shuffle(values, seed=key_seed, alg="philox")

    block = shuffle_buffer or _WHOLE_FILE

    def file_lines(index, name):  # one file's lines, shuffled per block; the key tells files and blocks apart
        blocks = _text_lines(name).batch(block).enumerate()  # (block index, lines [<= block])
        return blocks.map(_plain(lambda i, lines: permute(lines, index * _BLOCKS_PER_FILE + i))).unbatch()

    return tf.data.Dataset.from_tensor_slices(permute(names, -1)).enumerate().flat_map(_plain(file_lines))


def _chunks(
    files: list[str],
    *,
    reverse: bool,
    shuffle: bool,
    seed: tf.Tensor,
    shuffle_buffer: Optional[int],
    n_epochs: Optional[int],
) -> tf.data.Dataset:
    """The `_chunk_pairs` of one direction for every chunk of lines, over `n_epochs` epochs (None: forever)."""
    epochs = tf.data.Dataset.counter() if n_epochs is None else tf.data.Dataset.range(n_epochs)

    def epoch_lines(epoch):
        return _epoch_lines(files, epoch, shuffle=shuffle, seed=seed, shuffle_buffer=shuffle_buffer)

    lines = epochs.flat_map(_plain(epoch_lines))
    # Epochs are joined before the windowing: the row streams run on from one epoch into the next.
    return lines.batch(_CHUNK).map(_plain(lambda chunk: _chunk_pairs(chunk, reverse)), num_parallel_calls=tf.data.AUTOTUNE)


def _window_scan(batch_size: int, unroll_steps: int):
    """The scan (initial state, step) that deals the sentences of a chunk to rows and cuts every full window.

    State: the pending pairs of each row, string `[B, L, 2]` padded with "" (L = the longest row),
    and the rows' lengths `[B]`. Each sentence goes to the row with the fewest pending pairs (ties:
    the lowest row). Emitting a window takes U pairs from every row, which keeps the rows' order by
    length, so dealing a whole chunk before emitting gives exactly the windows of dealing and
    emitting sentence by sentence.
    """
    B, U = batch_size, unroll_steps
    rows = tf.range(B, dtype=tf.int64)  # [B]
    initial_state = (tf.zeros([B, 0, _NUM_COLUMNS], tf.string), tf.zeros([B], tf.int64))

    def deal(lengths: tf.Tensor, sizes: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Rows `[s]` of the sentences, their start in the row's pending stream `[s]`, new lengths `[B]`."""
        n = tf.size(sizes)
        keys = lengths * B + rows  # [B]; unique, so argmin is the shortest row, the lowest on ties

        def body(i, keys, taken):
            row = tf.argmin(keys)
            taken = taken.write(i, keys[row])
            keys = tf.tensor_scatter_nd_add(keys, row[None, None], sizes[i : i + 1] * B)
            return i + 1, keys, taken

        _, keys, taken = tf.while_loop(
            lambda i, *_: i < n, body, (0, keys, tf.TensorArray(tf.int64, size=n)), parallel_iterations=1
        )
        taken = taken.stack()  # [s]: start * B + row of each sentence
        return taken % B, taken // B, keys // B

    def step(state, chunk):
        buffer, lengths = state  # [B, L, 2], [B]
        sentence_rows, starts, lengths = deal(lengths, chunk["sizes"])  # [s], [s], [B]
        # Full windows: k = shortest row // U. At the held-out end: all that is left, the last padded.
        k = tf.where(chunk["is_end"], (tf.reduce_max(lengths) + U - 1) // U, tf.reduce_min(lengths) // U)
        width = tf.maximum(tf.reduce_max(lengths), k * U)
        buffer = tf.pad(buffer, [[0, 0], [0, width - tf.shape(buffer, out_type=tf.int64)[1]], [0, 0]])  # [B, width, 2]
        where = tf.stack(
            [
                tf.gather(sentence_rows, chunk["sentence"]),  # row of each new pair
                tf.gather(starts, chunk["sentence"]) + chunk["offset"],  # its place in the row
            ],
            axis=1,
        )  # [P, 2]
        buffer = tf.tensor_scatter_nd_update(buffer, where, chunk["pairs"])  # [B, width, 2]

        windows = tf.reshape(buffer[:, : k * U], [B, -1, U, _NUM_COLUMNS])  # [B, k, U, 2]
        windows = tf.transpose(windows, [1, 0, 2, 3])  # [k, B, U, 2]
        valid = tf.reshape(tf.range(k * U) < lengths[:, None], [B, -1, U])  # [B, k, U]
        valid = tf.transpose(valid, [1, 0, 2])  # [k, B, U]

        lengths = tf.maximum(lengths - k * U, 0)
        buffer = buffer[:, k * U : k * U + tf.reduce_max(lengths)]  # [B, L', 2]
        outputs = (tf.ensure_shape(windows, [None, B, U, _NUM_COLUMNS]), tf.ensure_shape(valid, [None, B, U]))
        return (buffer, lengths), outputs

    return initial_state, step


def _stream_windows(chunks: tf.data.Dataset, *, batch_size: int, unroll_steps: int) -> tf.data.Dataset:
    """One direction's `_chunk_pairs` dicts -> its windows `(pairs string [B, U, 2], valid bool [B, U])`."""
    initial_state, step = _window_scan(batch_size, unroll_steps)
    return chunks.scan(initial_state, _plain(step)).unbatch()


def _features(vocab: Vocabulary, *, batch_size: int, unroll_steps: int, max_chars: Optional[int], encoder=None):
    """The map from a window of both directions (`(pairs [B, U, 2], valid [B, U])` each) to the feature dicts of
    the module docstring."""
    table = vocab.lookup_table()
    encoder = encoder or ByteCharEncoder(max_chars)
    B, U = batch_size, unroll_steps

    def features(forward, backward):
        (fw, fw_valid), (bw, bw_valid) = forward, backward
        valid = tf.stack([fw_valid, bw_valid])  # [2, B, U]
        inputs = tf.reshape(tf.stack([fw[..., _INPUT], bw[..., _INPUT]]), [-1])  # [2BU]
        ids = {}
        for key, value in encoder.tokens(inputs).items():  # char_ids [2BU, C] and/or word_ids [2BU]
            value = tf.reshape(value, [2, B, U] + value.shape[1:].as_list())
            keep = tf.reshape(tf.cast(valid, tf.int32), [2, B, U] + [1] * (value.shape.rank - 3))
            ids[key] = value * keep  # padding slots: all-zero ids
        targets = table.lookup(tf.stack([fw[..., _TARGET], bw[..., _TARGET]]))  # [2, B, U]
        targets *= tf.cast(valid, tf.int32)
        weights = tf.cast(valid, tf.float32)  # [2, B, U]
        features = {}
        for d, direction in enumerate(("forward", "backward")):
            for key, value in ids.items():
                features[f"{key}_{direction}"] = tf.ensure_shape(value[d], [B, U] + value.shape[3:].as_list())
            features[f"targets_{direction}"] = tf.ensure_shape(targets[d], [B, U])
            features[f"weights_{direction}"] = tf.ensure_shape(weights[d], [B, U])
        return features

    return features


def _windows(streams, vocab: Vocabulary, *, batch_size: int, unroll_steps: int, max_chars: Optional[int],
             encoder=None) -> tf.data.Dataset:
    """The forward and backward `_chunks` streams -> the feature dicts of the module docstring."""
    windows = tf.data.Dataset.zip(
        tuple(_stream_windows(chunks, batch_size=batch_size, unroll_steps=unroll_steps) for chunks in streams)
    )  # ((fw [B, U, 2], valid [B, U]), (bw [B, U, 2], valid [B, U]))
    features = _features(vocab, batch_size=batch_size, unroll_steps=unroll_steps, max_chars=max_chars, encoder=encoder)
    return windows.map(_plain(features), num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def _stream_seed(seed: int, reverse: bool) -> tf.Tensor:
    """The shuffle seed of one direction's stream: the two streams are shuffled independently."""
    return tf.constant([seed, int(reverse)], tf.int64)


def lm_windows(
    file_pattern: str,
    vocab: Vocabulary,
    *,
    batch_size: int,
    unroll_steps: int,
    max_chars: Optional[int] = None,
    encoder=None,
    n_epochs: Optional[int] = None,
    shuffle: bool = True,
    seed: int = 0,
    shuffle_buffer: Optional[int] = None,
) -> tf.data.Dataset:
    """Training windows over a corpus, for truncated BPTT with the state carried per batch row.

    Args:
      file_pattern: glob of the corpus files, one whitespace-tokenized sentence per line.
      vocab: the target vocabulary (words outside it are predicted as `<UNK>`).
      batch_size: B, rows (parallel streams) per batch.
      unroll_steps: U, tokens per window.
      max_chars: C, `max_characters_per_token` of a character model (its ids: the original's byte ids).
      encoder: instead of `max_chars`, the model's `TokenEncoder` (`bilm.encoder`): its ids, whatever it reads.
      n_epochs: passes over the corpus; None repeats forever. The streams run on from one epoch into
        the next; the last partial windows of a finite run are dropped.
      shuffle: shuffle the file order and the lines of each file, differently in each epoch and
        independently for the forward and the backward stream (as the original's two `LMDataset`s).
      seed: seed of the shuffles (they do not depend on TF's global seed).
      shuffle_buffer: None (default) shuffles each file's lines as a whole, as the original does with a
        shard (the file is held in memory); an integer shuffles them in consecutive blocks of that many
        lines (blank ones included) instead, for files too large for memory.

    Returns:
      A dataset of dicts: `char_ids_forward`, `char_ids_backward` int32 `[B, U, C]` (and/or `word_ids_forward`,
      `word_ids_backward` `[B, U]`, as the encoder gives; `model_inputs` picks a direction's);
      `targets_forward`, `targets_backward` int32 `[B, U]`; `weights_forward`, `weights_backward`
      float32 `[B, U]` (all ones here). Its iterator is checkpointable (`tf.train.Checkpoint(iterator=...)`).
    """
    files = _check_args(file_pattern, vocab, batch_size, unroll_steps, max_chars, encoder)
    if n_epochs is not None and (not _is_int(n_epochs) or n_epochs < 1):
        raise ValueError(f"`n_epochs` must be None (repeat forever) or an integer >= 1; received {n_epochs!r}.")
    if shuffle_buffer is not None and (not _is_int(shuffle_buffer) or shuffle_buffer < 1):
        raise ValueError(f"`shuffle_buffer` must be None (whole files) or an integer >= 1; received {shuffle_buffer!r}.")
    if not _is_int(seed):
        raise ValueError(f"`seed` must be an integer; received {seed!r}.")
    streams = [
        _chunks(
            files,
            reverse=reverse,
            shuffle=shuffle,
            seed=_stream_seed(seed, reverse),
            shuffle_buffer=shuffle_buffer,
            n_epochs=n_epochs,
        )
        for reverse in (False, True)
    ]
    return _windows(streams, vocab, batch_size=batch_size, unroll_steps=unroll_steps, max_chars=max_chars,
                    encoder=encoder)


def heldout_windows(
    file_pattern: str, vocab: Vocabulary, *, batch_size: int, unroll_steps: int, max_chars: Optional[int] = None,
    encoder=None,
) -> tf.data.Dataset:
    """Windows over a held-out corpus: files in sorted order, no shuffle, one pass, nothing dropped.

    Same dicts as `lm_windows`; the final windows are padded (all-zero char ids, target 0) and
    `weights_forward` / `weights_backward` are 1 on real target positions and 0 on padding, so that
    summing the weighted losses counts every held-out token (n + 1 per sentence) exactly once.
    """
    files = _check_args(file_pattern, vocab, batch_size, unroll_steps, max_chars, encoder)
    none = tf.zeros([0], tf.int64)
    end = {"pairs": tf.zeros([0, _NUM_COLUMNS], tf.string), "sizes": none, "sentence": none, "offset": none}
    end["is_end"] = tf.constant(True)  # no sentence; tells the scan to flush what is left
    streams = [
        _chunks(files, reverse=reverse, shuffle=False, seed=_stream_seed(0, reverse), shuffle_buffer=None, n_epochs=1)
        .concatenate(tf.data.Dataset.from_tensors(end))
        for reverse in (False, True)
    ]  # both in file order, so both directions deal the same sentences to the same rows
    return _windows(streams, vocab, batch_size=batch_size, unroll_steps=unroll_steps, max_chars=max_chars,
                    encoder=encoder)


def sentence_windows(
    file_pattern: str, vocab: Vocabulary, *, batch_size: int, unroll_steps: int, max_chars: Optional[int] = None,
    encoder=None,
) -> tf.data.Dataset:
    """Windows over a held-out corpus with every sentence in a row of its own, as the exported module runs them.

    The non-blank lines, ordered by their number of tokens (each sentence is on its own, so the order does not
    change the figure; it keeps the padding small), are taken `batch_size` at a time; each group's sentences
    go one per row (the last group may leave rows empty), and the group's windows follow one another until
    its longest sentence ends. The dicts are those of `heldout_windows` plus `first` (bool scalar): True on each
    group's first window, where every row starts a sentence and the evaluator starts from a zero state.
    Every token (n + 1 per sentence and direction) is weighted 1 exactly once.
    """
    files = _check_args(file_pattern, vocab, batch_size, unroll_steps, max_chars, encoder)
    sentences = []  # (tokens, line bytes as in the file)
    for path in files:
        with open_corpus(path) as f:
            for line in f.read().split(b"\n"):
                n = len(line.decode("utf-8", errors="replace").split())
                if n:
                    sentences.append((n, line))
    sentences.sort(key=lambda sentence: sentence[0])
    groups = tf.data.Dataset.from_tensor_slices(tf.constant([line for _, line in sentences], tf.string))
    groups = groups.batch(batch_size)

    def stream(reverse):  # each group flushed whole (`is_end`): the next group starts on empty rows
        initial_state, step = _window_scan(batch_size, unroll_steps)
        chunks = groups.map(_plain(lambda chunk: {**_chunk_pairs(chunk, reverse), "is_end": tf.constant(True)}))
        return chunks.scan(initial_state, _plain(step))  # (windows [k, B, U, 2], valid [k, B, U]) per group

    def group_windows(forward, backward):  # both directions have the same k: the same sentences, lengths n + 1
        first = tf.range(tf.shape(forward[0])[0]) == 0
        return tf.data.Dataset.from_tensor_slices((forward, backward, first))

    features = _features(vocab, batch_size=batch_size, unroll_steps=unroll_steps, max_chars=max_chars, encoder=encoder)
    windows = tf.data.Dataset.zip((stream(False), stream(True))).flat_map(_plain(group_windows))
    return windows.map(
        _plain(lambda forward, backward, first: {**features(forward, backward), "first": first}),
        num_parallel_calls=tf.data.AUTOTUNE,
    ).prefetch(tf.data.AUTOTUNE)


MODEL_INPUTS = ("char_ids", "word_ids")


def model_inputs(batch: dict, direction: str) -> dict:
    """One direction's model inputs of a window dict: `{"char_ids": ..., "word_ids": ...}`, those it holds."""
    return {key: batch[f"{key}_{direction}"] for key in MODEL_INPUTS if f"{key}_{direction}" in batch}
