"""Plain numpy twins of causallm.kernels, picoGPT style: the math, line by line, with shapes.

These work on 2-D slices in float64 and say nothing about buffers, rows or threads, so they
are an independent check of the kernels (tests/test_kernels.py compares the two).
"""

import math

import numpy as np


def linear(x, w, b):  # [m, in], [in, out], [out] or [0] -> [m, out]
    y = x.astype(np.float64) @ w.astype(np.float64)  # [m, out]
    return y + b if b.shape[0] else y


def rms_norm(x, g, eps):  # [m, fs], [fs] -> [m, fs]
    x = x.astype(np.float64)
    ms = np.mean(x * x, axis=-1, keepdims=True)  # [m, 1]
    return x / np.sqrt(ms + eps) * g              # [m, fs]


def rope_tables(inv_freq, scaling, rows):  # [d/2] -> [rows, d/2], [rows, d/2]
    angle = np.arange(rows, dtype=np.float32)[:, None] * inv_freq[None, :]  # float32 angle as HF
    angle = angle.astype(np.float64)
    return np.cos(angle) * scaling, np.sin(angle) * scaling


def apply_rope(x, cos, sin):  # [n, d], [n, d/2], [n, d/2] -> [n, d]
    x = x.astype(np.float64)
    c = np.concatenate([cos, cos], axis=-1)                   # [n, d]
    s = np.concatenate([sin, sin], axis=-1)                   # [n, d]
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[:, half:], x[:, :half]], axis=-1)  # rotate_half: [n, d]
    return x * c + rotated * s


def attention_mask(q_pos, k_pos, window, causal, window_right=None, key_end=None):
    # [nq], [nk] -> [nq, nk] bool (True = attend); key_end [nq]: a causal query also sees keys < it
    q = q_pos[:, None]                             # [nq, 1]
    k = k_pos[None, :]                             # [1, nk]
    if causal:
        later = (k < key_end[:, None]) if key_end is not None else False
        return ((k <= q) | later) & (k > q - window)   # the window - 1 keys before, and later ones
    right = window if window_right is None else window_right
    return (k > q - window) & (k < q + right)      # non-causal: both sides (|q - k| < window)


def softmax(x):  # [..., n] -> [..., n]
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attention(q, k, v, mask, scale, softcap=0.0, sink=None, bias=None):  # [nq, d], [nk, d], [nk, d], [nq, nk] -> [nq, d]
    s = (q @ k.T) * scale                          # [nq, nk]
    if bias is not None:                           # an additive position bias [nq, nk] (T5)
        s = s + bias
    if softcap > 0:
        s = np.tanh(s / softcap) * softcap
    s = np.where(mask, s, -np.inf)                 # hide keys outside the window / the future
    if sink is not None:                           # the sink logit joins the softmax ...
        s = np.concatenate([s, np.full((s.shape[0], 1), sink)], axis=-1)  # [nq, nk + 1]
    p = softmax(s)
    if sink is not None:                           # ... but has no value vector
        p = p[:, :-1]                              # [nq, nk]
    return p @ v                                   # [nq, d]


def mha(q, k, v, q_pos, k_pos, n_heads, n_kv, cos, sin, window, causal, scale, softcap=0.0, sinks=None,
        bias=None, window_right=None, key_end=None, cross_k=None, cross_v=None):
    # [nq, n_heads*d], [nk, n_kv*d] (not rotated), [nk, n_kv*d] -> [nq, n_heads*d]; bias [n_heads, nq, nk];
    # cross_k, cross_v [nx, n_kv*d]: keys every query also sees, unrotated, in the same softmax
    d = q.shape[-1] // n_heads
    mask = attention_mask(q_pos, k_pos, window, causal, window_right, key_end)  # [nq, nk]
    out = []
    for h in range(n_heads):
        g = h // (n_heads // n_kv)                                          # GQA: repeat_kv
        qh = apply_rope(q[:, h * d:(h + 1) * d], cos[q_pos], sin[q_pos])    # [nq, d]
        kh = apply_rope(k[:, g * d:(g + 1) * d], cos[k_pos], sin[k_pos])    # [nk, d]
        vh = v[:, g * d:(g + 1) * d].astype(np.float64)                     # [nk, d]
        mh = mask
        if cross_k is not None:                                             # merged attention
            kh = np.concatenate([kh, cross_k[:, g * d:(g + 1) * d]])        # [nk + nx, d]
            vh = np.concatenate([vh, cross_v[:, g * d:(g + 1) * d]])
            mh = np.concatenate([mask, np.ones((len(q_pos), len(cross_k)), bool)], axis=1)
        sink = None if sinks is None else float(sinks[h])
        bh = None if bias is None else bias[h]
        if bh is not None and cross_k is not None:
            bh = np.concatenate([bh, np.zeros((len(q_pos), len(cross_k)))], axis=1)
        out.append(attention(qh, kh, vh, mh, scale, softcap, sink, bh))    # [nq, d]
    return np.concatenate(out, axis=-1)                                     # [nq, n_heads*d]


def swiglu(gate, up):  # [m, n], [m, n] -> [m, n]
    g = gate.astype(np.float64)
    return g / (1 + np.exp(-g)) * up


def gelu(x):  # exact: 0.5 x (1 + erf(x / sqrt 2))
    x = x.astype(np.float64)
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def tanh_gelu(x):  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    x = x.astype(np.float64)
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


ACTIVATIONS = {
    "none": lambda x: x.astype(np.float64),
    "silu": lambda x: x / (1 + np.exp(-x.astype(np.float64))),
    "gelu": gelu,
    "tanh_gelu": tanh_gelu,
    "relu": lambda x: np.maximum(x.astype(np.float64), 0),
    "tanh": lambda x: np.tanh(x.astype(np.float64)),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x.astype(np.float64))),
}


def embedding(ids, table, scale):  # [n] ids, [V, D] -> [n, D]
    return table[ids.astype(np.int64)].astype(np.float64) * scale
