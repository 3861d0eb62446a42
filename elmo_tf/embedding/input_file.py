"""Reading `embed`'s input: a UTF-8 text file, one sentence per line, in blocks or chunks (flat memory).

Lines end with "\\n" (a "\\r" before it is whitespace and is dropped by the split). Invalid UTF-8 is
reported with its 1-based line number.
"""

from __future__ import annotations

import hashlib
from typing import BinaryIO

from elmo_tf.errors import EmbedError

_SCAN_BLOCK_BYTES = 1 << 20


def count_lines(path: str) -> int:
    """Number of lines of a UTF-8 text file, read in blocks (flat memory).

    Raises:
      EmbedError: naming the first line (1-based) that is not valid UTF-8.
    """
    lines, tail = 0, b""
    with open(path, "rb") as f:
        while True:
            block = f.read(_SCAN_BLOCK_BYTES)
            if not block:
                break
            block = tail + block
            cut = block.rfind(b"\n") + 1  # decode whole lines only
            complete, tail = block[:cut], block[cut:]
            _check_utf8(complete, lines, path)
            lines += complete.count(b"\n")
    if tail:
        _check_utf8(tail, lines, path)
        lines += 1
    return lines


def _check_utf8(data: bytes, lines_before: int, path: str) -> None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        line = lines_before + data.count(b"\n", 0, e.start) + 1
        raise EmbedError(
            f"{path}: line {line} is not valid UTF-8 (byte {data[e.start]:#04x} at byte {e.start - line_start + 1} "
            "of the line). Convert the file to UTF-8 (e.g. `iconv -f latin1 -t utf-8`) or remove the line."
        ) from None


def read_lines(f: BinaryIO, n: int) -> list[bytes]:
    """The next (up to) n raw lines of `f`."""
    lines = []
    for raw in f:
        lines.append(raw)
        if len(lines) == n:
            break
    return lines


def decode_lines(raw_lines: list[bytes], first: int, path: str) -> list[str]:
    """Raw lines (the first of them line `first`, 0-based) as text without their newline."""
    texts = []
    for k, raw in enumerate(raw_lines):
        try:
            texts.append(raw.decode("utf-8").rstrip("\n"))
        except UnicodeDecodeError:  # the file changed after count_lines checked it
            _check_utf8(raw, first + k, path)
    return texts


def hash_lines(f: BinaryIO, n: int):
    """Reads past the next n lines of `f`; returns (a SHA-256 hasher fed with their bytes, lines read)."""
    hasher = hashlib.sha256()
    seen = 0
    if n == 0:
        return hasher, seen
    for raw in f:
        hasher.update(raw)
        seen += 1
        if seen == n:
            break
    return hasher, seen
