"""A file that can always be rolled back to its last commit (an undo journal), for h5py's file-object driver.

The embedder writes each chunk of its output through it, so that a chunk is saved whole or not at all, even
when the process is killed in the middle of an HDF5 save (`elmo_tf/embedding/hdf5_file.py`).
"""

from __future__ import annotations

import io
import os
import struct
from typing import Optional

from absl import logging

from elmo_tf.errors import EmbedError

JOURNAL_SUFFIX = ".journal"  # beside the file while a chunk is being written


class JournaledFile(io.RawIOBase):
    """A file for h5py's file-object driver that can always be rolled back to its last commit (an undo log).

    Before bytes that existed at the last commit are overwritten or cut, their old content is appended to
    `PATH.journal` as (offset, length, bytes); `commit()` deletes the journal. `roll_back(PATH)` (run by the
    constructor) writes the old bytes back, newest entry first so that the oldest content wins, and cuts the
    file to its committed size; it is idempotent, so a kill during a roll-back is harmless. A kill while an
    entry is being appended leaves a short last entry, which is ignored: its overwrite had not started.
    Only kills are covered, not power loss (nothing is fsync'ed).
    """

    _HEADER = struct.Struct("<8sQ")  # magic, committed size
    _ENTRY = struct.Struct("<QQ")  # offset, length
    _MAGIC = b"ELMOJRN1"

    def __init__(self, path: str):
        super().__init__()
        self.roll_back(path)
        self._file = open(path, "r+b", buffering=0)
        self.committed_size = os.fstat(self._file.fileno()).st_size
        self._journal_path = path + JOURNAL_SUFFIX
        self._journal = open(self._journal_path, "wb", buffering=0)
        write_all(self._journal, self._HEADER.pack(self._MAGIC, self.committed_size))
        self._saved = set()  # (begin, end) ranges journaled already

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def readinto(self, buffer) -> int:
        return self._file.readinto(buffer)

    def write(self, data) -> int:
        data = memoryview(data).cast("B")
        position = self._file.tell()
        self._save(position, min(position + len(data), self.committed_size))
        write_all(self._file, data)
        return len(data)

    def truncate(self, size: Optional[int] = None) -> int:
        size = self._file.tell() if size is None else size
        self._save(size, self.committed_size)
        return self._file.truncate(size)

    def flush(self) -> None:  # unbuffered: every write is already with the OS, which is what a kill needs
        pass

    def _save(self, begin: int, end: int) -> None:
        if begin >= end or (begin, end) in self._saved:
            return
        position = self._file.tell()
        self._file.seek(begin)
        old = self._file.read(end - begin)  # shorter if the file was cut below `end` earlier (already saved)
        self._file.seek(position)
        write_all(self._journal, self._ENTRY.pack(begin, len(old)) + old)
        self._saved.add((begin, end))

    def commit(self) -> None:
        """The file is complete as it is: forget the journal."""
        self.close()
        os.remove(self._journal_path)

    def close(self) -> None:
        if not self.closed:
            self._file.close()
            self._journal.close()
        super().close()

    @classmethod
    def roll_back(cls, path: str) -> bool:
        """Restores `path` to its last commit if a journal is left; returns whether it was."""
        journal_path = path + JOURNAL_SUFFIX
        if not os.path.exists(journal_path):
            return False
        with open(journal_path, "rb") as journal:
            header = journal.read(cls._HEADER.size)
            if len(header) == cls._HEADER.size:  # else killed before the first write: nothing to undo
                magic, committed_size = cls._HEADER.unpack(header)
                if magic != cls._MAGIC:
                    raise EmbedError(f"{journal_path!r} is not an elmo_tf journal; move it away to continue.")
                entries = []  # (offset, length, position of the bytes in the journal)
                while len(entry := journal.read(cls._ENTRY.size)) == cls._ENTRY.size:
                    offset, length = cls._ENTRY.unpack(entry)
                    position = journal.tell()
                    if journal.seek(length, os.SEEK_CUR) > os.fstat(journal.fileno()).st_size:
                        break  # cut short by a kill: its overwrite never started
                    entries.append((offset, length, position))
                with open(path, "r+b", buffering=0) as f:
                    for offset, length, position in reversed(entries):
                        journal.seek(position)
                        f.seek(offset)
                        write_all(f, journal.read(length))
                    f.truncate(committed_size)
        os.remove(journal_path)
        logging.info("Rolled %s back to its last saved chunk (the previous run stopped while writing).", path)
        return True


def write_all(f, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[f.write(view) :]
