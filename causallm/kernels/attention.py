"""Attention over a preallocated KV cache, with RoPE, GQA, sliding window, softcap, sinks and an
additive position bias; also cross-attention, whose keys are another sequence's, and merged
attention, whose softmax spans both (T5Gemma2's decoder).

Layouts (d = head_dim, g = kv head of q head h = h // (n_heads // n_kv), contiguous groups as
HF ``repeat_kv``)::

    q, out              (B, H, n_heads * d)   rows [0, nrows) hold positions pos0 + i
    k, v                (B, H, n_kv * d)
    k_cache, v_cache    (B', T, n_kv * d)     row t holds key position t; head j at [j*d, (j+1)*d);
                                              B' divides B: query row b reads key row b // (B / B')
    cos, sin            (rows >= pos0 + nrows, d/2)   from rope.rope_tables
    sinks               (n_heads,) or (0,)
    bias                (B, n_heads, 2C + 1) or (0, 0, 0): bias[b, h, C + t - p] is added to the
                        score of key t for the query at p (T5's relative position bias)
    cross_k, cross_v    (B'', Tx, n_kv * d) or (0, 0, 0): a second key set (another sequence's,
                        unrotated), of which the first cross_len rows join every query's softmax
    key_end             (B, nrows) int64 or (0, 0): a causal query row i may also see the keys
                        up to key_end[b, i] (exclusive; the rest of its image, Gemma 3)
    scratch             (B * n_heads, T + Tx + d)  per (b, h): scores, then the rotated query

RoPE (rotate-half, as HF ``apply_rotary_pos_emb``) at position p, halves a = x[:d/2],
b = x[d/2:]:  a' = a*cos[p] - b*sin[p],  b' = b*cos[p] + a*sin[p].  Keys are cached rotated.

For query row i at p = pos0 + i, the keys of the cache are t in [lo, hi), of the kv_len rows
holding keys::

    causal:      lo = max(0, p - window + 1),    hi = max(p + 1, key_end[b, i])
    non-causal:  lo = max(0, p - window + 1),    hi = min(kv_len, p + window_right)

i.e. the keys at distance < window before the query (and the query's own), and on the
non-causal side those at distance < window_right after it: HF's bidirectional sliding window
``|q - kv| < window`` has window_right = window, T5Gemma2's encoder window W has
window = (W + 1) // 2 and window_right = W // 2 + 1. Self-attention has kv_len = pos0 + nrows
(the keys written so far); cross-attention (the cache holds the encoder's kv_len keys, no
window) has every key. Then the cross keys, when given, all of them::

    s_t = (q'.k_t) * scale [+ bias[b, h, C + t - p]]       t in [lo, hi), then every cross key
    s_t = tanh(s_t / softcap) * softcap                             if softcap > 0
    m   = max(max_t s_t, sink_h)                                    (sink only if given)
    p_t = exp(s_t - m) / (sum_u exp(s_u - m) + exp(sink_h - m))
    out = sum_t p_t v_t

A window >= T means no window. The sink logit joins the softmax but has no value vector
(gpt-oss). This is the mathematically correct sliding-window mask for any nrows (NNTrainer's
x86 prefill kernel is wrong when nrows or pos0 + nrows exceeds the window, gotcha G4).
"""

import numpy as np
from numba import njit, prange

_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}  # reorder dot products; keep NaN/Inf rules


@njit(cache=True)
def kv_cache_write(k, v, k_cache, v_cache, cos, sin, pos0, nrows, n_kv, head_dim):
    """k_cache[b, pos0+i] = RoPE(k[b, i], pos0+i); v_cache[b, pos0+i] = v[b, i]; i < nrows."""
    B = k.shape[0]
    half = head_dim // 2
    width = n_kv * head_dim
    for b in range(B):
        for i in range(nrows):
            p = pos0 + i
            c = cos[p]
            s = sin[p]
            for g in range(n_kv):
                src = k[b, i, g * head_dim:(g + 1) * head_dim]
                dst = k_cache[b, p, g * head_dim:(g + 1) * head_dim]
                for j in range(half):
                    a = src[j]
                    bb = src[j + half]
                    dst[j] = a * c[j] - bb * s[j]
                    dst[j + half] = bb * c[j] + a * s[j]
            vs = v[b, i]
            vd = v_cache[b, p]
            for j in range(width):
                vd[j] = vs[j]


# Work (B * n_heads * rows * keys * head_dim) below which attention runs on one thread: a
# parallel region costs ~10-50 us to start and waits for its slowest thread.
PARALLEL_MIN_WORK = 1 << 18


@njit(cache=True, fastmath=_FASTMATH)
def _attend(q, k_cache, v_cache, out, cos, sin, sinks, bias, cross_k, cross_v, key_end, scratch,
            pos0, nrows, kv_len, cross_len, n_heads, n_kv, head_dim, window, window_right,
            causal, softcap, scale, task):
    """Rows i < nrows of query head h = task % n_heads of batch b = task // n_heads."""
    T = k_cache.shape[1]
    Tx = cross_k.shape[1]
    d = head_dim
    half = d // 2
    group = n_heads // n_kv
    use_sink = sinks.shape[0] == n_heads
    use_bias = bias.shape[0] > 0
    use_end = key_end.shape[0] > 0
    center = (bias.shape[2] - 1) // 2
    scale32 = np.float32(scale)
    cap = np.float32(softcap)
    b = task // n_heads
    kb = b * k_cache.shape[0] // q.shape[0]  # cross-attention: groups of query rows share keys
    xb = b * cross_k.shape[0] // q.shape[0] if cross_len > 0 else 0
    h = task % n_heads
    g = h // group
    score = scratch[task, :T + Tx]
    qr = scratch[task, T + Tx:T + Tx + d]
    for i in range(nrows):
        p = pos0 + i
        # rotate the query into scratch
        qh = q[b, i, h * d:(h + 1) * d]
        c = cos[p]
        s = sin[p]
        for j in range(half):
            a = qh[j]
            bb = qh[j + half]
            qr[j] = a * c[j] - bb * s[j]
            qr[j + half] = bb * c[j] + a * s[j]
        lo = max(0, p - window + 1)
        if causal:
            hi = p + 1
            if use_end and key_end[b, i] > hi:
                hi = key_end[b, i]
        else:
            hi = min(kv_len, p + window_right)
        n = hi - lo
        # scores and their max: the cache's keys [lo, hi), then the cross keys
        m = np.float32(0.0)
        for t in range(n + cross_len):
            if t < n:
                kt = k_cache[kb, lo + t, g * d:(g + 1) * d]
            else:
                kt = cross_k[xb, t - n, g * d:(g + 1) * d]
            acc = np.float32(0.0)
            for j in range(d):
                acc += qr[j] * kt[j]
            sc = acc * scale32
            if use_bias and t < n:
                sc += bias[b, h, center + lo + t - p]
            if cap > 0:
                sc = np.tanh(sc / cap) * cap
            score[t] = sc
            if t == 0 or sc > m:
                m = sc
        if use_sink and sinks[h] > m:
            m = sinks[h]
        # softmax numerators and denominator
        denom = np.float32(0.0)
        for t in range(n + cross_len):
            e = np.exp(score[t] - m)
            score[t] = e
            denom += e
        if use_sink:
            denom += np.exp(sinks[h] - m)
        inv = np.float32(1.0) / denom
        # weighted sum of values
        o = out[b, i, h * d:(h + 1) * d]
        for j in range(d):
            o[j] = 0
        for t in range(n + cross_len):
            pt = score[t] * inv
            if t < n:
                vt = v_cache[kb, lo + t, g * d:(g + 1) * d]
            else:
                vt = cross_v[xb, t - n, g * d:(g + 1) * d]
            for j in range(d):
                o[j] += pt * vt[j]


@njit(cache=True, parallel=True, fastmath=_FASTMATH)
def attention_parallel(q, k_cache, v_cache, out, cos, sin, sinks, bias, cross_k, cross_v,
                       key_end, scratch, pos0, nrows, kv_len, cross_len, n_heads, n_kv, head_dim,
                       window, window_right, causal, softcap, scale):
    """attention() with the (b, h) tasks spread over the thread pool."""
    for task in prange(q.shape[0] * n_heads):
        _attend(q, k_cache, v_cache, out, cos, sin, sinks, bias, cross_k, cross_v, key_end,
                scratch, pos0, nrows, kv_len, cross_len, n_heads, n_kv, head_dim, window,
                window_right, causal, softcap, scale, task)


@njit(cache=True, fastmath=_FASTMATH)
def attention_serial(q, k_cache, v_cache, out, cos, sin, sinks, bias, cross_k, cross_v,
                     key_end, scratch, pos0, nrows, kv_len, cross_len, n_heads, n_kv, head_dim,
                     window, window_right, causal, softcap, scale):
    """attention() on one thread (little work)."""
    for task in range(q.shape[0] * n_heads):
        _attend(q, k_cache, v_cache, out, cos, sin, sinks, bias, cross_k, cross_v, key_end,
                scratch, pos0, nrows, kv_len, cross_len, n_heads, n_kv, head_dim, window,
                window_right, causal, softcap, scale, task)


NO_WINDOW = 1 << 40
NO_SINKS = np.zeros(0, dtype=np.float32)
NO_BIAS = np.zeros((0, 0, 0), dtype=np.float32)
NO_CROSS = np.zeros((0, 0, 0), dtype=np.float32)
NO_KEY_END = np.zeros((0, 0), dtype=np.int64)
for _a in (NO_SINKS, NO_BIAS, NO_CROSS, NO_KEY_END):
    _a.flags.writeable = False


def attention(q, k_cache, v_cache, out, cos, sin, scratch, pos0, nrows, kv_len, n_heads, n_kv,
              head_dim, *, scale, window=NO_WINDOW, window_right=None, causal=True,
              softcap=0.0, sinks=NO_SINKS, bias=NO_BIAS, cross_k=NO_CROSS, cross_v=NO_CROSS,
              cross_len=0, key_end=NO_KEY_END):
    """out[b, i, h*d:(h+1)*d] = softmax(RoPE(q) . K / ...) V for rows i < nrows (module doc);
    ``window_right`` defaults to ``window``.

    One task per (b, h), on the thread pool when there is enough work. q is read (into
    scratch) before out is written, so out may be q.
    """
    window_right = window if window_right is None else window_right
    work = q.shape[0] * n_heads * nrows * (min(kv_len, window + window_right) + cross_len) \
        * head_dim
    kernel = attention_parallel if work >= PARALLEL_MIN_WORK else attention_serial
    kernel(q, k_cache, v_cache, out, cos, sin, sinks, bias, cross_k, cross_v, key_end, scratch,
           pos0, nrows, kv_len, cross_len, n_heads, n_kv, head_dim, min(window, NO_WINDOW),
           min(window_right, NO_WINDOW), causal, softcap, scale)


DENSE_BLOCK_ROWS = 512
"""Query rows per block of attention_dense: a block's scores (512 x keys) stay in cache through
the softmax's passes (a 4096-patch SigLIP layer: 0.95 -> 0.71 s)."""


def attention_dense(q, k, v, out, nrows, n_heads, n_kv, head_dim, scale):
    """Bidirectional attention of ``nrows`` rows over the same ``nrows`` keys, every key seen,
    no RoPE, window, bias, softcap or sink (a vision tower's, an encoder's): per head and block
    of DENSE_BLOCK_ROWS query rows, with numpy's matrix products (BLAS) and SIMD exp in
    float32::

        S = (Q_h * scale) K_g^T,   P = softmax(S) by rows,   O_h = P V_g

    The same math as ``attention(..., causal=False)`` on rows laid out as in the module
    docstring (q, out (B, H, n_heads * d); k, v (B, H, n_kv * d)); faster once nrows is in the
    tens, where the per-row kernel's scalar loops fall behind BLAS."""
    d, group = head_dim, n_heads // n_kv
    scale = np.float32(scale)
    for b in range(q.shape[0]):
        for h in range(n_heads):
            g = h // group
            kt = k[b, :nrows, g * d:(g + 1) * d].T
            vg = v[b, :nrows, g * d:(g + 1) * d]
            for r in range(0, nrows, DENSE_BLOCK_ROWS):
                e = min(r + DENSE_BLOCK_ROWS, nrows)
                s = (q[b, r:e, h * d:(h + 1) * d] * scale) @ kt
                s -= s.max(axis=1, keepdims=True)
                np.exp(s, out=s)
                s /= s.sum(axis=1, keepdims=True)
                out[b, r:e, h * d:(h + 1) * d] = s @ vg
