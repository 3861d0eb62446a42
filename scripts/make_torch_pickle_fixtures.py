"""Writes the PyTorch state-dict fixtures of tests/model/test_torch_pickle.py into tests/fixtures/torch_pickle/.

Runs only under a Python that has torch, which the project itself never needs (elmo_tf reads these files without
it); for example:

    python3 -m venv /work/torch_venv && /work/torch_venv/bin/pip install torch==2.13.0 numpy  # the committed files
    /work/torch_venv/bin/python scripts/make_torch_pickle_fixtures.py

Files written:
  state_zip.pt             one state dict, torch's zip format (the default since torch 1.6)
  state_legacy.pt          the same state dict, the pre-1.6 format (`_use_new_zipfile_serialization=False`)
  state_zip_big_endian.pt  a one-tensor state dict in the zip format, rewritten as a big-endian machine writes it
  expected.npz             the arrays the reader must return for state_zip.pt / state_legacy.pt
"""

from __future__ import annotations

import collections
import pathlib
import zipfile

import numpy as np
import torch

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "torch_pickle"


def _state_dict() -> "collections.OrderedDict[str, torch.Tensor]":
    """Every kind of tensor the reader must rebuild: each dtype of state dicts, a non-contiguous view, views sharing
    one storage with an offset, a Parameter and a 0-d tensor. It starts as a module's `state_dict()`, which carries
    `_metadata` (a BUILD instruction in the pickle)."""
    generator = torch.Generator().manual_seed(0)
    module = torch.nn.Module()
    module.embed = torch.nn.Linear(3, 5)
    with torch.no_grad():
        module.embed.weight.copy_(torch.randn(5, 3, generator=generator))  # float32, 2-D
        module.embed.bias.copy_(torch.randn(5, generator=generator))  # float32, 1-D
    state = module.state_dict()
    shared = torch.arange(12, dtype=torch.float32) / 4  # one storage, two views into it
    state["double"] = torch.randn(2, 2, generator=generator, dtype=torch.float64)
    state["long"] = torch.tensor([[1, -2, 3], [2**40, 0, -(2**40)]], dtype=torch.int64)
    state["transposed"] = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()  # stride (1, 3)
    state["view_head"] = shared[:4].view(2, 2)  # offset 0
    state["view_tail"] = shared[5:11].view(3, 2)  # offset 5, same storage
    state["parameter"] = torch.nn.Parameter(torch.randn(2, 3, generator=generator))
    state["scalar"] = torch.tensor(2.5)  # 0-d
    values = torch.tensor([[-3.0, 0.5], [1.25, 100.0]])  # exact in every float type below
    for dtype in (torch.float16, torch.bfloat16, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool):
        state[str(dtype).replace("torch.", "")] = values.abs().to(dtype) if dtype == torch.uint8 else values.to(dtype)
    return state


def _expected(tensor: torch.Tensor) -> np.ndarray:
    """The array the reader returns: the tensor's own dtype; bfloat16, which numpy lacks, widened to float32."""
    tensor = tensor.detach()
    return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()


def _write_big_endian(path: pathlib.Path) -> np.ndarray:
    """A zip-format file as torch writes it on a big-endian machine: byteorder "big", storage bytes swapped."""
    weight = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 8
    little = path.with_suffix(".tmp")
    torch.save({"w": weight}, little)
    with zipfile.ZipFile(little) as source, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename.endswith("/byteorder"):
                data = b"big"
            elif info.filename.endswith("/data/0"):  # the only storage: float32
                data = np.frombuffer(data, "<f4").astype(">f4").tobytes()
            target.writestr(info.filename, data)
    little.unlink()
    return weight.numpy()


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    state = _state_dict()
    torch.save(state, OUT / "state_zip.pt")
    torch.save(state, OUT / "state_legacy.pt", _use_new_zipfile_serialization=False)
    expected = {name: _expected(tensor) for name, tensor in state.items()}
    np.savez(OUT / "expected.npz", **expected)
    big_endian = _write_big_endian(OUT / "state_zip_big_endian.pt")

    # The files must read back in torch itself as written.
    for name in ("state_zip.pt", "state_legacy.pt"):
        loaded = torch.load(OUT / name, weights_only=False)
        assert list(loaded) == list(expected), name
        for key, array in expected.items():
            assert loaded[key].dtype == state[key].dtype and np.array_equal(_expected(loaded[key]), array), (name, key)
    assert np.array_equal(torch.load(OUT / "state_zip_big_endian.pt")["w"].numpy(), big_endian)
    for path in sorted(OUT.iterdir()):
        print(f"{path.stat().st_size:6d}  {path}")


if __name__ == "__main__":
    main()
