"""read_state_dict: torch.save files (zip and legacy) read without torch, and nothing in them ever run.

The fixtures in tests/fixtures/torch_pickle/ were written by torch (scripts/make_torch_pickle_fixtures.py). Hostile
and damaged files are built here with plain pickle/zipfile, or opcode by opcode where a tensor is needed.
"""

import os
import pathlib
import pickle
import struct
import zipfile

import numpy as np
import pytest

from elmo_tf.errors import WeightFileError
from elmo_tf.model.torch_pickle import read_state_dict
from tests.model.pickle_payloads import CreatesFile, RunsCommand

FIXTURES = pathlib.Path(__file__).parent.parent / "fixtures" / "torch_pickle"
LEGACY_MAGIC, LEGACY_VERSION = 0x1950A86A20F9469CFC6C, 1001


# -- Files made here --




def zip_file(path, data_pkl, records=None):
    """A zip-format file: archive/data.pkl, archive/byteorder, archive/data/<key> for each record."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", data_pkl)
        archive.writestr("archive/byteorder", "little")
        for key, data in (records or {}).items():
            archive.writestr(f"archive/data/{key}", data)
    return str(path)


def legacy_file(path, main_pickle, storages=()):
    """A legacy-format file: magic, version, machine info, `main_pickle`, storage keys, then (count, bytes) each."""
    info = {"protocol_version": LEGACY_VERSION, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 8}}
    parts = [pickle.dumps(LEGACY_MAGIC, 2), pickle.dumps(LEGACY_VERSION, 2), pickle.dumps(info, 2), main_pickle,
             pickle.dumps([key for key, _ in storages], 2)]
    parts += [struct.pack("<q", values.size) + values.tobytes() for _, values in storages]
    pathlib.Path(path).write_bytes(b"".join(parts))
    return str(path)


# A state dict pickle spelled out opcode by opcode, as torch writes one (protocol 2), without torch.
def op_str(text):
    data = text.encode()
    return pickle.BINUNICODE + struct.pack("<I", len(data)) + data


def op_int(n):
    return pickle.BININT + struct.pack("<i", n)


def op_global(module, name):
    return pickle.GLOBAL + f"{module}\n{name}\n".encode()


def op_tuple(items):
    return pickle.MARK + b"".join(items) + pickle.TUPLE


def op_tensor(storage_id, offset, size, stride, rebuild="_rebuild_tensor_v2"):
    """A call of torch._utils.<rebuild>(storage, offset, size, stride[, requires_grad, hooks])."""
    args = [op_tuple(storage_id) + pickle.BINPERSID, op_int(offset), op_tuple(map(op_int, size)),
            op_tuple(map(op_int, stride))]
    if rebuild == "_rebuild_tensor_v2":
        args += [pickle.NEWFALSE, op_global("collections", "OrderedDict") + pickle.EMPTY_TUPLE + pickle.REDUCE]
    return op_global("torch._utils", rebuild) + op_tuple(args) + pickle.REDUCE


def storage_id(key, numel, storage_class="FloatStorage", module="torch", view=None, legacy=False):
    """The persistent id of a storage: zip files have 5 fields, legacy files a 6th (a view or None)."""
    items = [op_str("storage"), op_global(module, storage_class), op_str(key), op_str("cuda:0"), op_int(numel)]
    if legacy:
        items.append(pickle.NONE if view is None else op_tuple([op_str(view[0]), op_int(view[1]), op_int(view[2])]))
    return items


def op_dict_pickle(entries):
    body = b"".join(op_str(name) + value for name, value in entries.items())
    return pickle.PROTO + b"\x02" + pickle.EMPTY_DICT + pickle.MARK + body + pickle.SETITEMS + pickle.STOP


# -- Files torch wrote --


@pytest.mark.parametrize("name", ["state_zip.pt", "state_legacy.pt"])
def test_reads_what_torch_wrote_exactly(name):
    expected = np.load(FIXTURES / "expected.npz")
    arrays = read_state_dict(str(FIXTURES / name))
    assert list(arrays) == list(expected.keys())  # file order
    for key in expected:
        assert arrays[key].dtype == expected[key].dtype, key
        assert np.array_equal(arrays[key], expected[key]), key
        assert arrays[key].flags.c_contiguous and arrays[key].flags.writeable, key
    # What the fixture is made of (so a regenerated fixture still tests the hard cases).
    assert arrays["scalar"].shape == () and arrays["transposed"].shape == (3, 2)
    assert arrays["view_tail"].ravel()[0] == 5 / 4  # offset 5 into the storage it shares with view_head
    assert {str(a.dtype) for a in arrays.values()} >= {"float32", "float64", "int64", "float16", "int8", "bool"}


def test_big_endian_zip_is_converted():
    arrays = read_state_dict(str(FIXTURES / "state_zip_big_endian.pt"))
    assert arrays["w"].dtype == np.dtype("=f4")
    assert np.array_equal(arrays["w"], np.arange(6, dtype=np.float32).reshape(2, 3) / 8)


def test_old_spellings_storage_views_and_gpu_storages(tmp_path):
    """torch < 1.0: _rebuild_tensor, torch.cuda storage classes, a storage view (elements 2..4 of storage "s")."""
    main = op_dict_pickle({
        "old": op_tensor(storage_id("s", 6, module="torch.cuda", legacy=True), 1, (2, 2), (2, 1), "_rebuild_tensor"),
        "view": op_tensor(storage_id("s", 6, view=("v", 2, 3), legacy=True), 1, (2,), (1,)),
        "ints": op_tensor(storage_id("i", 3, "IntStorage", legacy=True), 0, (3,), (1,)),
    })
    path = legacy_file(tmp_path / "old.pkl", main, [("i", np.array([7, -8, 9], "<i4")),
                                                      ("s", np.arange(6, dtype="<f4"))])
    arrays = read_state_dict(path)
    assert np.array_equal(arrays["old"], [[1, 2], [3, 4]]) and arrays["old"].dtype == np.float32
    assert np.array_equal(arrays["view"], [3, 4])
    assert np.array_equal(arrays["ints"], [7, -8, 9]) and arrays["ints"].dtype == np.int32


# -- Pickles that would run code --


def refused(path, name):
    return (f"{path}: refusing to load: the pickle asks for {name!r}, which could run code; "
            "only tensors and ordered dicts are read.")


@pytest.mark.parametrize("layout", ["zip", "legacy"])
def test_a_pickle_that_calls_a_function_is_refused_and_nothing_runs(tmp_path, layout):
    marker = tmp_path / "marker"
    payload = pickle.dumps({"w": CreatesFile(marker)}, protocol=2)
    pickle.loads(payload).pop("w").close()  # plain pickle does run it: the check below can fail
    assert marker.exists()
    marker.unlink()

    path = zip_file(tmp_path / "evil.pt", payload) if layout == "zip" else legacy_file(tmp_path / "evil.pt", payload)
    with pytest.raises(WeightFileError) as caught:
        read_state_dict(path)
    assert str(caught.value) == refused(path, f"{open.__module__}.open")
    assert not marker.exists()


def test_os_system_and_module_classes_are_refused(tmp_path):
    marker = tmp_path / "marker"
    path = zip_file(tmp_path / "a.pt", pickle.dumps(RunsCommand(f"touch {marker}"), protocol=2))
    with pytest.raises(WeightFileError, match="asks for '(posix|nt).system', which could run code"):
        read_state_dict(path)
    assert not marker.exists()

    module = pickle.PROTO + b"\x02" + op_global("torch.nn.modules.linear", "Linear") + pickle.EMPTY_TUPLE + \
        pickle.NEWOBJ + pickle.STOP  # what torch.save(model) writes for a whole module
    path = legacy_file(tmp_path / "b.pt", module)
    with pytest.raises(WeightFileError) as caught:
        read_state_dict(path)
    assert str(caught.value) == refused(path, "torch.nn.modules.linear.Linear")


def test_persistent_ids_other_than_storages_are_refused(tmp_path):
    main = op_dict_pickle({"w": op_tuple([op_str("module"), op_str("x")]) + pickle.BINPERSID})
    with pytest.raises(WeightFileError, match=r"asks for the outside object \('module', 'x'\), which is not a "
                                              "tensor storage"):
        read_state_dict(zip_file(tmp_path / "a.pt", main))


# -- Damaged files and files of other kinds --


def message(path):
    with pytest.raises(WeightFileError) as caught:
        read_state_dict(str(path))
    text = str(caught.value)
    assert "\n" not in text and text.startswith(f"{path}: ")
    return text[len(f"{path}: "):]


def test_truncated_and_damaged_zip(tmp_path):
    data = (FIXTURES / "state_zip.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    assert message(tmp_path / "cut.pt").startswith("is a damaged or truncated zip archive")
    flipped = bytearray(data)
    flipped[data.index(b"collections")] ^= 1  # inside data.pkl, stored uncompressed
    (tmp_path / "flipped.pt").write_bytes(bytes(flipped))
    assert "Bad CRC-32 for file 'state_zip/data.pkl'" in message(tmp_path / "flipped.pt")


def test_storage_shorter_than_its_tensors(tmp_path):
    with zipfile.ZipFile(FIXTURES / "state_zip.pt") as source:  # data/0 is embed.weight: 15 float32
        records = {info.filename: source.read(info) for info in source.infolist()}
    with zipfile.ZipFile(tmp_path / "short.pt", "w") as target:
        for name, data in records.items():
            target.writestr(name, data[:-4] if name.endswith("/data/0") else data)
    assert message(tmp_path / "short.pt") == \
        "is truncated or damaged: storage '0' holds 14 values; tensor 'embed.weight' needs 15."

    main = op_dict_pickle({"w": op_tensor(storage_id("0", 4), 2, (3,), (1,))})
    path = zip_file(tmp_path / "past.pt", main, {"0": np.zeros(4, "<f4").tobytes()})
    assert "tensor 'w' (size (3,), stride (1,), offset 2) reaches past the 4 values" in message(path)


def test_truncated_legacy(tmp_path):
    data = (FIXTURES / "state_legacy.pt").read_bytes()
    (tmp_path / "tail.pt").write_bytes(data[:-10])
    assert message(tmp_path / "tail.pt").startswith("is truncated: storage ")
    (tmp_path / "head.pt").write_bytes(data[:200])  # inside the main pickle
    assert message(tmp_path / "head.pt").startswith("is damaged or truncated: its pickle cannot be read")


def test_files_that_are_not_torch_files(tmp_path):
    assert message(tmp_path / "missing.pt") == "does not exist or is not a file."
    (tmp_path / "text.pt").write_text("ELMo options, not weights\n")
    assert message(tmp_path / "text.pt") == \
        "is not a PyTorch file (neither a zip archive nor the legacy torch.save format)."
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as archive:
        archive.writestr("readme.txt", "hello")
    assert "without <folder>/data.pkl" in message(tmp_path / "other.zip")


def test_top_level_must_be_a_dict_of_tensors(tmp_path):
    assert message(zip_file(tmp_path / "list.pt", pickle.dumps([1.0, 2.0], protocol=2))) == \
        "holds a value of type list, not a dict of tensors (a state_dict)."
    main = op_dict_pickle({"w": op_tensor(storage_id("0", 1, legacy=True), 0, (), ()), "step": op_int(3)})
    path = legacy_file(tmp_path / "mixed.pt", main, [("0", np.ones(1, "<f4"))])
    assert message(path) == ("entry 'step' is a value of type int, not a tensor; only a dict of tensors "
                             "(a state_dict) is read.")
