"""An independent float64 numpy implementation of the ORIGINAL ELMo forward pass (docs/ELMO_SPEC.md, Part 1).

Written from the spec text only, so that elmo_tf can be checked against it for option sets that have
no fixture. It reproduces the original's zero-state first call, including its masked-position values
(quirk 2: layer 0 at a masked position k holds the token embedding of padding slot k + 2).

Shapes: B sentences, S = T + 2 slots, C chars per token, e char embedding dim, F CNN features,
P projection dim, H LSTM dim, h = LSTM output width (P if P < H else H), L LSTM layers.
"""

from __future__ import annotations

import h5py
import numpy as np

BOS, EOS, BOW, EOW, PAD = 256, 257, 258, 259, 260  # raw ids; the model sees raw + 1


def _lstm_prefix(direction: int, layer: int) -> str:
    return f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _dims(options: dict) -> tuple[int, int, int, int]:
    cnn, lstm = options["char_cnn"], options["lstm"]
    f = sum(n for _, n in cnn["filters"])
    h_cell = lstm["dim"]
    p = lstm.get("projection_dim", h_cell)
    return f, p, h_cell, (p if p < h_cell else h_cell)


# Character ids (the original UnicodeCharsVocabulary + Batcher) ----------------------------------------


def char_ids(sentences: list[list[str]], max_chars: int) -> np.ndarray:
    """Tokenized sentences -> int64 `[B, T + 2, C]`, the Batcher output (raw ids + 1, 0 = padded slot)."""

    def word(token: str) -> list[int]:
        if token in ("<S>", "</S>"):  # the vocab holds these strings, so they become boundary rows
            inner = [BOS if token == "<S>" else EOS]
        else:
            inner = list(token.encode("utf-8", "ignore")[: max_chars - 2])
        return [BOW, *inner, EOW] + [PAD] * (max_chars - 2 - len(inner))

    t = max((len(s) for s in sentences), default=0)
    ids = np.zeros([len(sentences), t + 2, max_chars], np.int64)
    for b, sentence in enumerate(sentences):
        rows = [word("<S>")] + [word(tok) for tok in sentence] + [word("</S>")]
        ids[b, : len(rows)] = np.array(rows) + 1
    return ids


# Forward pass --------------------------------------------------------------------------------------------


def token_embeddings(options: dict, weights: dict, ids: np.ndarray) -> np.ndarray:
    """Char-CNN -> highway -> projection on every slot (padding slots included): `[B, S, C]` -> `[B, S, P]`."""
    cnn = options["char_cnn"]
    f, p, _, _ = _dims(options)
    act = {"relu": lambda v: np.maximum(v, 0.0), "tanh": np.tanh}[cnn.get("activation", "relu")]
    table = np.concatenate([np.zeros([1, cnn["embedding"]["dim"]]), weights["char_embed"]], 0)
    x = table[ids]  # [B, S, C, e]; id 0 embeds to zero, model id i uses file row i - 1
    c = ids.shape[-1]
    features = []
    for k, (width, _) in enumerate(cnn["filters"]):
        kernel = weights[f"CNN/W_cnn_{k}"][0]  # [w, e, n]
        conv = sum(x[..., i : i + c - width + 1, :] @ kernel[i] for i in range(width))  # [B, S, C-w+1, n]
        features.append(act(conv.max(axis=-2) + weights[f"CNN/b_cnn_{k}"]))  # max, then activation
    x = np.concatenate(features, -1)  # [B, S, F]
    for hw in range(cnn.get("n_highway") or 0):
        w = {name: weights[f"CNN_high_{hw}/{name}"] for name in ("W_carry", "b_carry", "W_transform", "b_transform")}
        gate = _sigmoid(x @ w["W_carry"] + w["b_carry"])  # the "carry" gate multiplies the transform branch
        transform = np.maximum(x @ w["W_transform"] + w["b_transform"], 0.0)  # always relu
        x = gate * transform + (1.0 - gate) * x
    if f != p:
        x = x @ weights["CNN_proj/W_proj"] + weights["CNN_proj/b_proj"]  # [B, S, P]
    return x


def _run_lstm(options: dict, weights: dict, prefix: str, inputs: np.ndarray, residual: bool) -> np.ndarray:
    """One LSTM layer, one direction, zero initial state: `[n, in_dim]` -> `[n, h]`."""
    lstm = options["lstm"]
    _, p, hc, h = _dims(options)
    kernel, bias = weights[f"{prefix}/W_0"], weights[f"{prefix}/B"]
    cell_clip, proj_clip = lstm.get("cell_clip"), lstm.get("proj_clip")
    c, m = np.zeros(hc), np.zeros(h)
    outputs = []
    for x_t in inputs:
        z = np.concatenate([x_t, m]) @ kernel + bias
        i, j, f, o = np.split(z, 4)  # gate order i, j, f, o
        c = _sigmoid(f + 1.0) * c + _sigmoid(i) * np.tanh(j)  # forget bias +1 added at run time
        if cell_clip is not None:
            c = np.clip(c, -cell_clip, cell_clip)
        m = _sigmoid(o) * np.tanh(c)
        if p < hc:
            m = m @ weights[f"{prefix}/W_P_0"]
            if proj_clip is not None:
                m = np.clip(m, -proj_clip, proj_clip)
        outputs.append(m + x_t if residual else m)  # the residual is not clipped; the state keeps m
    return np.array(outputs)  # [n, h]


def forward(options: dict, weights: dict, ids: np.ndarray) -> dict[str, np.ndarray]:
    """The original's first (zero-state) call on Batcher ids `[B, T + 2, C]`.

    Returns float64 arrays: `token_embeddings` `[B, T + 2, P]` (all slots), `lm_embeddings`
    `[B, L + 1, T, 2P]` (BOS/EOS removed, with the original's masked-position values), `mask` `[B, T]`,
    `lengths` `[B]`.
    """
    weights = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    lstm = options["lstm"]
    n_layers, skip = lstm["n_layers"], lstm.get("use_skip_connections", False)
    _, p, _, h = _dims(options)
    tok = token_embeddings(options, weights, ids)  # [B, S, P]
    batch, slots = ids.shape[:2]
    t = slots - 2
    lengths = (ids > 0).any(-1).sum(-1) - 2  # [B]
    lm = np.zeros([batch, n_layers + 1, t, 2 * p])
    for b in range(batch):
        n = lengths[b]
        seq = {"fw": tok[b, : n + 2], "bw": tok[b, : n + 2][::-1]}  # the backward LSTM reads EOS ... BOS
        for layer in range(n_layers):
            for d, key in enumerate(("fw", "bw")):
                seq[key] = _run_lstm(options, weights, _lstm_prefix(d, layer), seq[key], skip and layer > 0)
            out = np.concatenate([seq["fw"], seq["bw"][::-1]], -1)  # [n + 2, 2h], input order
            lm[b, layer + 1, :n] = out[1 : n + 1]  # drop BOS/EOS; LSTM layers are 0 past the length
        lm[b, 0, :n] = np.concatenate([tok[b, 1 : n + 1]] * 2, -1)
        lm[b, 0, n:] = np.concatenate([tok[b, n + 2 :]] * 2, -1)  # quirk 2: masked k holds slot k + 2
    mask = np.arange(t)[None, :] < lengths[:, None]
    return {"token_embeddings": tok, "lm_embeddings": lm, "mask": mask, "lengths": lengths}


# Random weights in the original HDF5 layout -----------------------------------------------------------


def weight_shapes(options: dict) -> dict[str, tuple[int, ...]]:
    """Every dataset of the original `weights.hdf5` for `options`, with its shape."""
    cnn, lstm = options["char_cnn"], options["lstm"]
    e = cnn["embedding"]["dim"]
    f, p, hc, h = _dims(options)
    shapes = {"char_embed": (261, e)}
    for k, (width, count) in enumerate(cnn["filters"]):
        shapes[f"CNN/W_cnn_{k}"] = (1, width, e, count)
        shapes[f"CNN/b_cnn_{k}"] = (count,)
    for hw in range(cnn.get("n_highway") or 0):
        shapes.update({f"CNN_high_{hw}/W_carry": (f, f), f"CNN_high_{hw}/W_transform": (f, f)})
        shapes.update({f"CNN_high_{hw}/b_carry": (f,), f"CNN_high_{hw}/b_transform": (f,)})
    if f != p:
        shapes.update({"CNN_proj/W_proj": (f, p), "CNN_proj/b_proj": (p,)})
    for d in range(2):
        for layer in range(lstm["n_layers"]):
            prefix = _lstm_prefix(d, layer)
            in_dim = p if layer == 0 else h
            shapes.update({f"{prefix}/W_0": (in_dim + h, 4 * hc), f"{prefix}/B": (4 * hc,)})
            if p < hc:
                shapes[f"{prefix}/W_P_0"] = (hc, p)
    return shapes


def random_original_weights(options: dict, seed: int) -> dict[str, np.ndarray]:
    """Random float32 weights for `options`; std 1 / sqrt(fan-in) (biases 0.5) so activations stay O(1)."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in weight_shapes(options).items():
        if name == "char_embed":
            scale = 1.0
        elif len(shape) == 1:
            scale = 0.5  # biases
        else:
            scale = 1.0 / np.sqrt(np.prod(shape[:-1]))  # 1 / sqrt(fan-in)
        weights[name] = (scale * rng.standard_normal(shape)).astype(np.float32)
    return weights


def write_hdf5(weights: dict[str, np.ndarray], path: str) -> None:
    """Writes `weights` as float32 datasets named by their HDF5 paths (groups are created as needed)."""
    with h5py.File(path, "w") as f:
        for name, value in weights.items():
            f.create_dataset(name, data=np.asarray(value, np.float32))
