"""Plain-numpy statements of the layer maths (float64), used as references by the layer tests."""

import numpy as np


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def lstm(x, mask, kernel, bias, projection=None, cell_clip=None, proj_clip=None, state=None):
    """One direction: x [B, S, D], mask [B, S] (prefix) -> outputs [B, S, h], final (c, m)."""
    x, kernel, bias = (np.asarray(a, np.float64) for a in (x, kernel, bias))
    batch, steps, _ = x.shape
    units = bias.shape[0] // 4
    out_dim = units if projection is None else projection.shape[1]
    c = np.zeros((batch, units)) if state is None else np.asarray(state[0], np.float64)
    m = np.zeros((batch, out_dim)) if state is None else np.asarray(state[1], np.float64)
    outputs = np.zeros((batch, steps, out_dim))
    for t in range(steps):
        z = np.concatenate([x[:, t], m], axis=-1) @ kernel + bias
        i, j, f, o = np.split(z, 4, axis=-1)
        c_new = sigmoid(f + 1.0) * c + sigmoid(i) * np.tanh(j)
        if cell_clip is not None:
            c_new = np.clip(c_new, -cell_clip, cell_clip)
        m_new = sigmoid(o) * np.tanh(c_new)
        if projection is not None:
            m_new = m_new @ projection
            if proj_clip is not None:
                m_new = np.clip(m_new, -proj_clip, proj_clip)
        keep = np.asarray(mask)[:, t : t + 1]
        c = np.where(keep, c_new, c)
        m = np.where(keep, m_new, m)
        outputs[:, t] = np.where(keep, m_new, 0.0)
    return outputs, (c, m)


def reverse_by_length(x, lengths):
    out = np.array(x, copy=True)
    for b, n in enumerate(lengths):
        out[b, :n] = x[b, :n][::-1]
    return out
