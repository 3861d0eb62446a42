"""Reads a PyTorch `torch.save(module.state_dict())` file into numpy arrays, without torch and without running code.

ELMoForManyLangs ships its models as such files (`token_embedder.pkl`, `encoder.pkl`). A pickle is a small program
for a stack machine; the only dangerous instruction is "fetch the global module.name" (then call it), which a
`pickle.Unpickler` resolves in `find_class`. Ours answers only with small functions of this module that rebuild
tensors as placeholders, plus `collections.OrderedDict`; anything else stops the read with WeightFileError before
anything is called. Before that, each pickle's instructions are walked once without acting on any, so that a damaged
length reads as "truncated" instead of making the unpickler allocate it. The storage bytes are read last and cut
into arrays with numpy.

How torch lays out a tensor: a *storage* is a flat run of elements of one type (`torch.FloatStorage`: float32, ...).
In the pickle, each storage is an out-of-band reference (a pickle "persistent id", a tuple starting "storage");
a tensor is the call `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks)`
(`_rebuild_tensor(storage, offset, size, stride)` in old files), offset and strides counted in elements, so views
share one storage and a transposed tensor is just other strides. An `nn.Parameter` wraps its tensor in
`torch._utils._rebuild_parameter(tensor, requires_grad, hooks)`. The device ('cpu', 'cuda:0') is ignored.

The two file layouts:

  zip (the default since torch 1.6): a zip archive whose records sit in one folder, e.g. `encoder/`:
    encoder/data.pkl    the pickle; storage ids are ("storage", storage class, key, device, element count)
    encoder/data/<key>  the raw bytes of storage <key>
    encoder/byteorder   "little" or "big", the byte order of those bytes (absent in old files: little)
    others (version, .format_version, .storage_alignment, .data/serialization_id) are bookkeeping, not read.

  legacy (before torch 1.6, or `_use_new_zipfile_serialization=False`): one stream of back-to-back parts
    1. a pickled int, the magic number 0x1950A86A20F9469CFC6C
    2. a pickled int, the format version 1001
    3. a pickled dict describing the machine that wrote it (not needed)
    4. the pickle; storage ids are ("storage", storage class, key, device, element count, view), where view is
       None or (view key, offset, element count) for a slice of the storage
    5. a pickled list of storage keys; then, for each key in that order, its element count as an 8-byte
       little-endian integer followed by its raw bytes (always little-endian).
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import pickletools
import zipfile
import zlib
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from elmo_tf.errors import WeightFileError

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_VERSION = 1001

# Storage class -> element type as stored (little-endian). numpy has no bfloat16: its 16 bits are read as uint16 and
# widened to float32, which holds every bfloat16 value exactly.
_STORAGE_DTYPES = {
    "DoubleStorage": "<f8", "FloatStorage": "<f4", "HalfStorage": "<f2", "BFloat16Storage": "<u2",
    "LongStorage": "<i8", "IntStorage": "<i4", "ShortStorage": "<i2", "CharStorage": "i1", "ByteStorage": "u1",
    "BoolStorage": "?",
}
_STORAGE_MODULES = ("torch", "torch.cuda")  # torch < 1.0 names a GPU tensor's storage torch.cuda.FloatStorage


class _Refused(Exception):
    """Why the file is not read; read_state_dict puts the file name in front and raises WeightFileError."""


class _Damaged(_Refused):
    """A pickle that cannot be read at all (truncated, or not a pickle)."""


class _StorageType(NamedTuple):
    name: str  # e.g. "FloatStorage"
    dtype: np.dtype  # the element type of the bytes


class _Storage(NamedTuple):
    """A persistent id: elements [offset, offset + numel) of the stored storage `key`."""
    key: str
    type: _StorageType
    offset: int
    numel: int


class _Tensor(NamedTuple):
    """A tensor of the pickle, before its storage bytes are read."""
    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


# -- What the pickle may call: small functions of ours that only build placeholders --


def _is_index_tuple(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and all(isinstance(n, int) and n >= 0 for n in value)


def _rebuild_tensor(storage: Any, storage_offset: Any, size: Any, stride: Any) -> _Tensor:
    if not isinstance(storage, _Storage):
        raise _Refused(f"a tensor is built on {_describe(storage)}, not on a storage; the file is damaged.")
    if not (isinstance(storage_offset, int) and storage_offset >= 0 and _is_index_tuple(size)
            and _is_index_tuple(stride) and len(size) == len(stride)):
        raise _Refused(f"a tensor has an invalid offset, size or stride "
                       f"{_clip(repr((storage_offset, size, stride)))}; the file is damaged.")
    return _Tensor(storage, storage_offset, tuple(size), tuple(stride))


def _rebuild_tensor_v2(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any = False,
                       backward_hooks: Any = None, metadata: Any = None) -> _Tensor:
    if metadata:
        raise _Refused(f"a tensor carries the flags {_clip(repr(metadata))} (a negated or conjugated view), "
                       "which are not read.")
    return _rebuild_tensor(storage, storage_offset, size, stride)


def _rebuild_parameter(data: Any, requires_grad: Any, backward_hooks: Any) -> _Tensor:
    if not isinstance(data, _Tensor):
        raise _Refused(f"an nn.Parameter wraps {_describe(data)}, not a tensor; the file is damaged.")
    return data


_GLOBALS = {
    "collections.OrderedDict": collections.OrderedDict,
    "torch._utils._rebuild_tensor": _rebuild_tensor,
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor_v2,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
}


class _Unpickler(pickle.Unpickler):
    """Resolves only the globals above and the storage classes; collects the storages the pickle refers to."""

    def __init__(self, file: BinaryIO):
        super().__init__(file)
        self.storage_types: dict[str, _StorageType] = {}  # key -> type, for every storage referred to

    def find_class(self, module: str, name: str) -> Any:
        qualified = f"{module}.{name}"
        if qualified in _GLOBALS:
            return _GLOBALS[qualified]
        if module in _STORAGE_MODULES and name in _STORAGE_DTYPES:
            return _StorageType(name, np.dtype(_STORAGE_DTYPES[name]))
        raise _Refused(f"refusing to load: the pickle asks for {_clip(qualified)!r}, which could run code; "
                       "only tensors and ordered dicts are read.")

    def persistent_load(self, pid: Any) -> _Storage:
        kind = pid[0] if isinstance(pid, tuple) and pid else None
        kind = kind.decode("ascii", "replace") if isinstance(kind, bytes) else kind
        if kind != "storage" or len(pid) not in (5, 6):
            raise _Refused(f"refusing to load: the pickle asks for the outside object {_clip(repr(pid))}, which is "
                           "not a tensor storage; only tensors and ordered dicts are read.")
        storage_type, key, _device, numel = pid[1:5]
        view = pid[5] if len(pid) == 6 else None
        if not (isinstance(storage_type, _StorageType) and isinstance(key, str)
                and isinstance(numel, int) and numel >= 0):
            raise _Refused(f"a storage reference {_clip(repr(pid))} is malformed; the file is damaged.")
        if self.storage_types.setdefault(key, storage_type) != storage_type:
            raise _Refused(f"storage {key!r} is referred to as both {self.storage_types[key].name} and "
                           f"{storage_type.name}; the file is damaged.")
        if view is None:
            return _Storage(key, storage_type, 0, numel)
        _view_key, offset, view_numel = view  # a slice of storage `key` (legacy files only)
        if not (isinstance(offset, int) and isinstance(view_numel, int) and 0 <= offset <= offset + view_numel):
            raise _Refused(f"a storage view {_clip(repr(view))} is malformed; the file is damaged.")
        return _Storage(key, storage_type, offset, view_numel)


# -- The public function --


def read_state_dict(path: str) -> dict[str, np.ndarray]:
    """The tensors of a `torch.save`d state dict (zip or legacy format), by name in file order, as contiguous numpy
    arrays of the stored dtype (bfloat16 as float32). No torch needed; nothing from the file is run.

    Raises WeightFileError (one line, naming the file) when the file is missing, not a torch file, damaged or
    truncated, asks the unpickler for anything but tensors and ordered dicts, or holds anything but a dict of
    tensors.
    """
    path = os.fspath(path)
    try:
        return _read(path)
    except _Refused as e:
        raise WeightFileError(f"{path}: {e}") from None


def _read(path: str) -> dict[str, np.ndarray]:
    if not os.path.isfile(path):
        raise _Refused("does not exist or is not a file.")
    try:
        with open(path, "rb") as f:
            is_zip = _is_zip(f)
            f.seek(0)
            state, storages = _read_zip(path) if is_zip else _read_legacy(f)
    except OSError as e:
        raise _Refused(f"cannot be read ({e.strerror or e}).") from None
    return _to_arrays(_check_state_dict(state), storages)


def _is_zip(f: BinaryIO) -> bool:
    """Whether `f` starts like a zip archive or has a zip directory at its end (damaged or not)."""
    if f.read(4) == b"PK\x03\x04":
        return True
    try:
        return zipfile.is_zipfile(f)
    except zipfile.BadZipFile:  # a zip directory that zipfile cannot use: still a zip archive, a damaged one
        return True


def _read_zip(path: str) -> tuple[Any, dict[str, np.ndarray]]:
    """The pickled object and its storages (key -> 1-D array) of a zip-format file."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            pickles = [name for name in names if name.endswith("/data.pkl") and name.count("/") == 1]
            if not pickles:
                raise _Refused("is a zip archive without <folder>/data.pkl, not a state dict written by torch.save.")
            folder = pickles[0][: -len("data.pkl")]
            byteorder = archive.read(folder + "byteorder") if folder + "byteorder" in names else b"little"
            if byteorder not in (b"little", b"big"):
                raise _Refused(f"names the byte order {_clip(repr(byteorder))}; expected 'little' or 'big'.")
            state, storage_types = _load(io.BytesIO(archive.read(pickles[0])))
            big_endian = byteorder == b"big"
            storages = {}
            for key, storage_type in storage_types.items():
                record = f"{folder}data/{key}"
                if record not in names:
                    raise _Refused(f"has no record {record!r} for storage {key!r}; the file is damaged.")
                storages[key] = _storage_array(archive.read(record), storage_type, big_endian)
            return state, storages
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError, ValueError, RuntimeError,
            NotImplementedError) as e:  # what zipfile raises for a damaged archive (OSError: a seek before its start)
        raise _Refused(f"is a damaged or truncated zip archive ({_one_line(e)}).") from None


def _read_legacy(file: BinaryIO) -> tuple[Any, dict[str, np.ndarray]]:
    """The pickled object and its storages (key -> 1-D array) of a legacy-format file."""
    f = _Bounded(file)
    try:
        magic, _ = _load(f)
    except _Damaged:
        magic = None
    if magic != _LEGACY_MAGIC:
        raise _Refused("is not a PyTorch file (neither a zip archive nor the legacy torch.save format).")
    version, _ = _load(f)
    if version != _LEGACY_VERSION:
        raise _Refused(f"is a legacy torch.save file of format version {_clip(repr(version))}; "
                       f"only {_LEGACY_VERSION} is known.")
    _load(f)  # the writer's machine: its byte order does not matter, storages are little-endian
    state, storage_types = _load(f)
    keys, _ = _load(f)
    if not (isinstance(keys, list) and all(isinstance(key, str) for key in keys)):
        raise _Refused("the list of storage keys after the pickle is malformed; the file is damaged.")
    left = f.left()
    storages = {}
    for key in keys:
        if key not in storage_types:
            raise _Refused(f"stores storage {key!r}, which no tensor refers to; the file is damaged.")
        storage_type = storage_types[key]
        count = int.from_bytes(f.read(8), "little") if left >= 8 else None
        nbytes = None if count is None else count * storage_type.dtype.itemsize
        if nbytes is None or nbytes > left - 8:
            raise _Refused(f"is truncated: storage {key!r} is cut short.")
        storages[key] = _storage_array(f.read(nbytes), storage_type, False)
        left -= 8 + nbytes
    return state, storages


class _Bounded:
    """A file whose read(n) never returns, nor asks for, more than is left in it."""

    def __init__(self, file: BinaryIO):
        self._file, self._size = file, os.fstat(file.fileno()).st_size

    def left(self) -> int:
        return self._size - self._file.tell()

    def read(self, n: int = -1) -> bytes:
        return self._file.read(self.left() if n is None or n < 0 else min(n, self.left()))

    def readline(self) -> bytes:
        return self._file.readline()

    def tell(self) -> int:
        return self._file.tell()

    def seek(self, offset: int) -> int:
        return self._file.seek(offset)


# Out-of-band buffers (pickle protocol 5): torch.save never writes them, and BYTEARRAY8 allocates its length first.
_BUFFER_OPCODES = ("BYTEARRAY8", "NEXT_BUFFER", "READONLY_BUFFER")
_MEMO_OPCODES = ("PUT", "BINPUT", "LONG_BINPUT")


def _load(f: Any) -> tuple[Any, dict[str, _StorageType]]:
    """The next pickle of `f` (a bounded file or BytesIO), and the storages it refers to (key -> type).

    Its opcodes are first walked without acting on any (pickletools.genops), which checks every length against
    the bytes that are left: a damaged length then reads as "truncated" rather than making the unpickler allocate
    it, and a memo index must be one a writer could have reached. Then _Unpickler reads it for real.
    """
    start = f.tell()
    try:
        for count, (opcode, arg, _) in enumerate(pickletools.genops(f)):
            if opcode.name in _BUFFER_OPCODES:
                raise _Refused(f"refusing to load: the pickle uses the out-of-band buffer opcode {opcode.name}, "
                               "which torch.save never writes; only tensors and ordered dicts are read.")
            if opcode.name in _MEMO_OPCODES and not 0 <= int(arg) <= count:
                raise _Damaged(f"is damaged: its pickle stores memo entry {arg} after {count} instructions.")
        f.seek(start)
        unpickler = _Unpickler(f)
        return unpickler.load(), unpickler.storage_types
    except _Refused:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged pickle fails in many ways (EOFError, UnpicklingError, ...)
        raise _Damaged(f"is damaged or truncated: its pickle cannot be read ({type(e).__name__}: "
                       f"{_one_line(e)}).") from None


def _storage_array(data: bytes, storage_type: _StorageType, big_endian: bool) -> np.ndarray:
    """The stored bytes of one storage as a 1-D array of its native dtype (bfloat16 widened to float32)."""
    dtype = storage_type.dtype.newbyteorder(">") if big_endian else storage_type.dtype
    count = len(data) // dtype.itemsize
    array = np.frombuffer(data, dtype, count).astype(dtype.newbyteorder("="), copy=False)
    if storage_type.name == "BFloat16Storage":
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array


def _check_state_dict(state: Any) -> dict[str, _Tensor]:
    if not isinstance(state, dict):
        raise _Refused(f"holds {_describe(state)}, not a dict of tensors (a state_dict).")
    for key, value in state.items():
        if not isinstance(key, str):
            raise _Refused(f"has the key {_clip(repr(key))}, which is not a string; a state_dict maps names "
                           "to tensors.")
        if not isinstance(value, _Tensor):
            raise _Refused(f"entry {key!r} is {_describe(value)}, not a tensor; only a dict of tensors "
                           "(a state_dict) is read.")
    return state


def _to_arrays(state: dict[str, _Tensor], storages: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each tensor as a contiguous copy of its elements: storage[offset + sum(index * stride)]."""
    arrays = {}
    for name, tensor in state.items():
        storage = tensor.storage
        if storage.key not in storages:
            raise _Refused(f"tensor {name!r} refers to storage {storage.key!r}, which the file does not hold; "
                           "the file is damaged.")
        flat = storages[storage.key]
        if storage.offset + storage.numel > len(flat):
            raise _Refused(f"is truncated or damaged: storage {storage.key!r} holds {len(flat)} values; "
                           f"tensor {name!r} needs {storage.offset + storage.numel}.")
        flat = flat[storage.offset:storage.offset + storage.numel]
        if 0 in tensor.size:
            arrays[name] = np.zeros(tensor.size, flat.dtype)
            continue
        last = tensor.offset + sum((n - 1) * s for n, s in zip(tensor.size, tensor.stride))
        if last >= len(flat):
            raise _Refused(f"tensor {name!r} (size {tensor.size}, stride {tensor.stride}, offset {tensor.offset}) "
                           f"reaches past the {len(flat)} values of its storage; the file is damaged.")
        view = np.lib.stride_tricks.as_strided(
            flat[tensor.offset:], tensor.size, [s * flat.itemsize for s in tensor.stride], writeable=False)
        arrays[name] = np.array(view, order="C")
    return arrays


def _describe(value: Any) -> str:
    if isinstance(value, _Tensor):
        return "a tensor"
    if isinstance(value, _Storage):
        return "a bare storage"
    return f"a value of type {type(value).__name__}"


def _one_line(error: BaseException) -> str:
    return _clip(" ".join(str(error).split()) or type(error).__name__)


def _clip(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
