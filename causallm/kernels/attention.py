"""Attention over a preallocated KV cache, with RoPE, GQA, sliding window, softcap, sinks and an
additive position bias; also cross-attention, whose keys are another sequence's, and merged
attention, whose softmax spans both (T5Gemma2's decoder).

Layouts (d = head_dim, g = kv head of q head h = h // (n_heads // n_kv), contiguous groups as
HF ``repeat_kv``)::

    q, out              (B, H, n_heads * d)   rows [0, nrows) of the step
    k, v                (B, H, n_kv * d)
    slots, positions    (B, >= nrows) int64   row i of batch b belongs to the sequence whose keys
                                              are cache row slots[b, i], at position
                                              positions[b, i] (by default slot b, positions
                                              pos0 + i: one sequence per batch row; a step may
                                              also carry rows of several sequences, each at its
                                              own position, in one batch row)
    k_cache, v_cache    (S, n_kv, T, d)       a self cache: [s, j, t] holds kv head j of position
                                              t of the sequence in slot s
                        or (B', T, n_kv * d)  keys given as rows (an encoder's, cross keys): row
                                              t holds position t, head j at [j*d, (j+1)*d);
                                              B' divides B: query row b reads key row b // (B / B')
    cos, sin            (rows > every position, d/2)   from rope.rope_tables
    sinks               (n_heads,) or (0,)
    bias                (B, n_heads, 2C + 1) or (0, 0, 0): bias[b, h, C + t - p] is added to the
                        score of key t for the query at p (T5's relative position bias)
    cross_k, cross_v    (B'', Tx, n_kv * d) or (0, 0, 0): a second key set as rows (another
                        sequence's, unrotated), of which the first cross_len join every softmax
    key_end             (B, nrows) int64 or (0, 0): a causal query row i may also see the keys
                        up to key_end[b, i] (exclusive; the rest of its image, Gemma 3)
    scratch             (B * n_heads, >= keys + Tx + d)  per (b, h): scores; the rotated query
                                              in its last d columns

RoPE (rotate-half, as HF ``apply_rotary_pos_emb``) at position p, halves a = x[:d/2],
b = x[d/2:]:  a' = a*cos[p] - b*sin[p],  b' = b*cos[p] + a*sin[p].  Keys are cached rotated.

For query row i at p = positions[b, i], the keys of its slot's cache are t in [lo, hi), of the
kv_len rows holding keys::

    causal:      lo = max(0, p - window + 1),    hi = max(p + 1, key_end[b, i])
    non-causal:  lo = max(0, p - window + 1),    hi = min(kv_len, p + window_right)

i.e. the keys at distance < window before the query (and the query's own), and on the
non-causal side those at distance < window_right after it: HF's bidirectional sliding window
``|q - kv| < window`` has window_right = window, T5Gemma2's encoder window W has
window = (W + 1) // 2 and window_right = W // 2 + 1. Self-attention has kv_len = pos0 + nrows
(the keys written so far; a causal query reads none past its own position); cross-attention
(the cache holds the encoder's kv_len keys, no window) has every key. Then the cross keys, when given, all of them::

    s_t = (q'.k_t) * scale [+ bias[b, h, C + t - p]]       t in [lo, hi), then every cross key
    s_t = tanh(s_t / softcap) * softcap                             if softcap > 0
    m   = max(max_t s_t, sink_h)                                    (sink only if given)
    p_t = exp(s_t - m) / (sum_u exp(s_u - m) + exp(sink_h - m))
    out = sum_t p_t v_t

A window >= T means no window. The sink logit joins the softmax but has no value vector
(gpt-oss). This is the mathematically correct sliding-window mask for any nrows (NNTrainer's
x86 prefill kernel is wrong when nrows or pos0 + nrows exceeds the window: docs/nntrainer.md,
"Sliding-window mask").
"""

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from causallm.kernels.expf import expf
from causallm.kernels.jit_cache import read_only
from causallm.kernels.simd import (addf16, fmaf, fmaf16, fold8, hsum, load1f, load8f,
                                   load16f, splatf, store8f, store16f, store_hsum4, zerof16)
from causallm.kernels.team import (Program, address, array1, array2, array3, array4, encode,
                                   real, words)
from causallm.kernels.threads import matmul, threads

_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}  # reorder dot products; keep NaN/Inf rules


@intrinsic
def f32_to_f16(typingctx, x):
    """IEEE half bits (uint16) of a float32, rounded to nearest even."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
    return types.uint16(types.float32), codegen


def _store_impl(x, like):
    """A float32 as an element of the cache ``like`` (float32, or FP16 bits)."""


@overload(_store_impl)
def _store(x, like):
    if isinstance(like, types.Array) and like.dtype == types.uint16:
        return lambda x, like: f32_to_f16(np.float32(x))
    return lambda x, like: x


def row_at(cache, b, g, t, d):
    """The flat offset of kv head g of position t in batch row b of a C-contiguous cache:
    (B, n_kv, T, d), or rows (B, T, n_kv * d). The kernels address cache rows by offset: a view
    of a row per key made numba count references to the cache, two atomic operations a key,
    which were most of a decode step's attention."""


@overload(row_at)
def _row_at(cache, b, g, t, d):
    if cache.ndim == 4:
        return lambda cache, b, g, t, d: ((b * cache.shape[1] + g) * cache.shape[2] + t) * d
    return lambda cache, b, g, t, d: (b * cache.shape[1] + t) * cache.shape[2] + g * d


def kv_cache_write(k, v, k_cache, v_cache, cos, sin, pos0, nrows, n_kv, head_dim, *,
                   slots=None, positions=None):
    """k_cache[s, g, p] = RoPE(k[b, i, head g], p); v_cache[s, g, p] = v[b, i, head g] for the
    step's rows i < nrows of every batch b, at slot s = slots[b, i] (default b) and position
    p = positions[b, i] (default pos0 + i). The caches (S, n_kv, T, d) are float32, or uint16
    FP16 bits (values rounded to nearest even)."""
    slots, positions = step_rows(k.shape[0], pos0, nrows, k_cache.shape[0], slots, positions)
    Program([_write_op(k, v, k_cache, v_cache, cos, sin, slots, positions, nrows, n_kv,
                       head_dim)]).run(1)


def step_rows(batch, pos0, nrows, key_rows=None, slots=None, positions=None):
    """``slots`` and ``positions`` as given, or those of a step of ``nrows`` rows at pos0 in
    every batch row b ((batch, nrows) int64 each): positions pos0 + i and slot b, or with
    ``key_rows`` B' rows of keys (an encoder's, shared by groups of query rows) row
    b // (batch / B')."""
    if slots is None:
        slots = np.repeat(np.arange(batch, dtype=np.int64)[:, None], nrows, axis=1)
        if key_rows is not None:
            slots = slots * key_rows // batch
    if positions is None:
        positions = np.repeat(np.arange(pos0, pos0 + nrows, dtype=np.int64)[None, :], batch,
                              axis=0)
    return slots, positions


@njit(cache=True)
def _kv_write(k, v, k_cache, v_cache, cos, sin, slots, positions, nrows, n_kv, head_dim):
    B = k.shape[0]
    d = head_dim
    half = d // 2
    for b in range(B):
        for i in range(nrows):
            p = positions[b, i]
            sl = slots[b, i]
            c = cos[p]
            s = sin[p]
            for g in range(n_kv):
                src = k[b, i, g * d:(g + 1) * d]
                dst = k_cache[sl, g, p]
                for j in range(half):
                    a = src[j]
                    bb = src[j + half]
                    dst[j] = _store_impl(a * c[j] - bb * s[j], dst)
                    dst[j + half] = _store_impl(bb * c[j] + a * s[j], dst)
                vs = v[b, i, g * d:(g + 1) * d]
                vd = v_cache[sl, g, p]
                for j in range(d):
                    vd[j] = _store_impl(vs[j], vd)


@njit(cache=True, fastmath=_FASTMATH, inline="always")
def _dot(x, cache, o, d):
    """sum_j x[j] * cache[o + j] (flat offsets; a cache of float32 or FP16 bits), sixteen lanes
    at a time in two sums, then eight, then one."""
    a0 = zerof16()
    a1 = zerof16()
    j = 0
    while j + 32 <= d:
        a0 = fmaf16(a0, load16f(cache, o + j), load16f(x, j))
        a1 = fmaf16(a1, load16f(cache, o + j + 16), load16f(x, j + 16))
        j += 32
    if j + 16 <= d:
        a0 = fmaf16(a0, load16f(cache, o + j), load16f(x, j))
        j += 16
    e = fold8(addf16(a0, a1))
    if j + 8 <= d:
        e = fmaf(e, load8f(x, j), load8f(cache, o + j))
        j += 8
    acc = hsum(e)
    for k in range(j, d):
        acc += x[k] * load1f(cache, o + k)
    return acc


@njit(cache=True, fastmath=_FASTMATH, inline="always")
def _dots(out, x, cache, b, g, lo, t0, t1, d):
    """out[t] = x . row(lo + t) for t0 <= t < t1, the rows of ``cache`` (row_at). Four keys at
    a time, each in two sums of sixteen lanes: eight independent multiply-add chains, where one
    key's dot alone waits on the latency of its own. Widening an FP16 row (one instruction for
    sixteen values, two micro-ops) is what bounds it: 512-bit lanes nearly halved these dots'
    time per key and head over 256-bit ones, alone (the whole kernel's 0.9; docs/performance.md,
    "Attention in 512-bit lanes")."""
    t = t0
    while t + 4 <= t1:
        o0 = row_at(cache, b, g, lo + t, d)
        o1 = row_at(cache, b, g, lo + t + 1, d)
        o2 = row_at(cache, b, g, lo + t + 2, d)
        o3 = row_at(cache, b, g, lo + t + 3, d)
        a0, a1, a2, a3 = zerof16(), zerof16(), zerof16(), zerof16()
        c0, c1, c2, c3 = zerof16(), zerof16(), zerof16(), zerof16()
        j = 0
        while j + 32 <= d:
            x0, x1 = load16f(x, j), load16f(x, j + 16)
            a0 = fmaf16(a0, load16f(cache, o0 + j), x0)
            a1 = fmaf16(a1, load16f(cache, o1 + j), x0)
            a2 = fmaf16(a2, load16f(cache, o2 + j), x0)
            a3 = fmaf16(a3, load16f(cache, o3 + j), x0)
            c0 = fmaf16(c0, load16f(cache, o0 + j + 16), x1)
            c1 = fmaf16(c1, load16f(cache, o1 + j + 16), x1)
            c2 = fmaf16(c2, load16f(cache, o2 + j + 16), x1)
            c3 = fmaf16(c3, load16f(cache, o3 + j + 16), x1)
            j += 32
        if j + 16 <= d:
            x0 = load16f(x, j)
            a0 = fmaf16(a0, load16f(cache, o0 + j), x0)
            a1 = fmaf16(a1, load16f(cache, o1 + j), x0)
            a2 = fmaf16(a2, load16f(cache, o2 + j), x0)
            a3 = fmaf16(a3, load16f(cache, o3 + j), x0)
            j += 16
        e0, e1 = fold8(addf16(a0, c0)), fold8(addf16(a1, c1))
        e2, e3 = fold8(addf16(a2, c2)), fold8(addf16(a3, c3))
        if j + 8 <= d:
            x8 = load8f(x, j)
            e0 = fmaf(e0, x8, load8f(cache, o0 + j))
            e1 = fmaf(e1, x8, load8f(cache, o1 + j))
            e2 = fmaf(e2, x8, load8f(cache, o2 + j))
            e3 = fmaf(e3, x8, load8f(cache, o3 + j))
            j += 8
        store_hsum4(out, t, e0, e1, e2, e3)
        for k in range(j, d):
            out[t] += x[k] * load1f(cache, o0 + k)
            out[t + 1] += x[k] * load1f(cache, o1 + k)
            out[t + 2] += x[k] * load1f(cache, o2 + k)
            out[t + 3] += x[k] * load1f(cache, o3 + k)
        t += 4
    for u in range(t, t1):
        out[u] = _dot(x, cache, row_at(cache, b, g, lo + u, d), d)


@njit(cache=True, fastmath=_FASTMATH, inline="always")
def _weighted_rows(o, score, cache, b, g, lo, t0, t1, d):
    """o[j] += sum_{t0 <= t < t1} score[t] * row(lo + t)[j], the rows of ``cache`` (row_at):
    64 columns of o held in four sixteen-lane sums for even keys and four for odd ones (eight
    independent chains) while the rows stream by, then 16, 8 and 1 columns at a time."""
    j = 0
    while j + 64 <= d:
        a0, a1, a2, a3 = load16f(o, j), load16f(o, j + 16), load16f(o, j + 32), load16f(o, j + 48)
        c0, c1, c2, c3 = zerof16(), zerof16(), zerof16(), zerof16()
        t = t0
        while t + 2 <= t1:
            r = row_at(cache, b, g, lo + t, d) + j
            s = row_at(cache, b, g, lo + t + 1, d) + j
            w, v = score[t], score[t + 1]
            a0 = fmaf16(a0, load16f(cache, r), w)
            a1 = fmaf16(a1, load16f(cache, r + 16), w)
            a2 = fmaf16(a2, load16f(cache, r + 32), w)
            a3 = fmaf16(a3, load16f(cache, r + 48), w)
            c0 = fmaf16(c0, load16f(cache, s), v)
            c1 = fmaf16(c1, load16f(cache, s + 16), v)
            c2 = fmaf16(c2, load16f(cache, s + 32), v)
            c3 = fmaf16(c3, load16f(cache, s + 48), v)
            t += 2
        if t < t1:
            r = row_at(cache, b, g, lo + t, d) + j
            w = score[t]
            a0 = fmaf16(a0, load16f(cache, r), w)
            a1 = fmaf16(a1, load16f(cache, r + 16), w)
            a2 = fmaf16(a2, load16f(cache, r + 32), w)
            a3 = fmaf16(a3, load16f(cache, r + 48), w)
        store16f(o, j, addf16(a0, c0))
        store16f(o, j + 16, addf16(a1, c1))
        store16f(o, j + 32, addf16(a2, c2))
        store16f(o, j + 48, addf16(a3, c3))
        j += 64
    while j + 16 <= d:
        a0 = load16f(o, j)
        for t in range(t0, t1):
            a0 = fmaf16(a0, load16f(cache, row_at(cache, b, g, lo + t, d) + j), score[t])
        store16f(o, j, a0)
        j += 16
    while j + 8 <= d:
        a8 = load8f(o, j)
        for t in range(t0, t1):
            a8 = fmaf(a8, splatf(score[t]), load8f(cache, row_at(cache, b, g, lo + t, d) + j))
        store8f(o, j, a8)
        j += 8
    for k in range(j, d):
        acc = o[k]
        for t in range(t0, t1):
            acc += score[t] * load1f(cache, row_at(cache, b, g, lo + t, d) + k)
        o[k] = acc


_TILE = 64  # key (value) rows a task reads once for all its heads: 32 KiB at head_dim 128

# Work (B * n_heads * rows * keys * head_dim) below which attention runs on one thread: a
# parallel region costs some 5-10 us to start and waits for its slowest thread. 2^15: SmolLM2's
# decode attention (9 heads of 64) is parallel from about 57 keys (quant.PARALLEL_MIN_BYTES).
PARALLEL_MIN_WORK = 1 << 15


@njit(cache=True, fastmath=_FASTMATH)
def _attend(q, k_cache, v_cache, out, cos, sin, sinks, bias, cross_k, cross_v, key_end, scratch,
            slots, positions, nrows, kv_len, cross_len, n_heads, n_kv, head_dim, window,
            window_right, causal, softcap, scale, parts, task0, task1):
    """Tasks [task0, task1), each rows i < nrows of the query heads [h0, h1) of kv head g of
    batch b: task = (b, g, part), the group's heads split into ``parts``. Each key and value row
    is read once for them all; head h keeps its scores and rotated query in scratch row
    b * n_heads + h. Run by the team op ``attend`` (``attention_ops``), the step's keys and
    values written before by the op ``write``."""
    d = head_dim
    qcol = scratch.shape[1] - d  # the rotated query's columns in a scratch row
    half = d // 2
    group = n_heads // n_kv
    per = group // parts
    use_sink = sinks.shape[0] == n_heads
    use_bias = bias.shape[0] > 0
    use_end = key_end.shape[0] > 0
    center = (bias.shape[2] - 1) // 2
    scale32 = np.float32(scale)
    cap = np.float32(softcap)
    for task in range(task0, task1):
        b = task // (n_kv * parts)
        g = (task // parts) % n_kv
        h0 = g * group + (task % parts) * per
        xb = b * cross_k.shape[0] // q.shape[0] if cross_len > 0 else 0
        for i in range(nrows):
            p = positions[b, i]
            kb = slots[b, i]
            c = cos[p]
            s = sin[p]
            for h in range(h0, h0 + per):
                qh = q[b, i, h * d:(h + 1) * d]
                qr = scratch[b * n_heads + h, qcol:]
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
            # scores, a tile of key rows at a time: each tile read from memory once for all the
            # heads of the task (it stays in cache for the next head)
            total = n + cross_len
            for t0 in range(0, total, _TILE):
                t1 = min(t0 + _TILE, total)
                for h in range(h0, h0 + per):
                    row = scratch[b * n_heads + h]
                    qr = row[qcol:]
                    _dots(row, qr, k_cache, kb, g, lo, t0, min(t1, n), d)
                    _dots(row, qr, cross_k, xb, g, -n, max(t0, n), t1, d)
                    seg = row[t0:t1]  # from index 0: the loop vectorizes (_softmax_row)
                    for j in range(t1 - t0):
                        sc = seg[j] * scale32
                        if use_bias and t0 + j < n:
                            sc += bias[b, h, center + lo + t0 + j - p]
                        if cap > 0:
                            sc = np.tanh(sc / cap) * cap
                        seg[j] = sc
            # softmax per head
            for h in range(h0, h0 + per):
                score = scratch[b * n_heads + h, :total]
                m = score[0]
                for t in range(1, total):
                    if score[t] > m:
                        m = score[t]
                if use_sink and sinks[h] > m:
                    m = sinks[h]
                denom = np.float32(0.0)
                for t in range(total):
                    e = expf(score[t] - m)
                    score[t] = e
                    denom += e
                if use_sink:
                    denom += expf(sinks[h] - m)
                inv = np.float32(1.0) / denom
                for t in range(total):
                    score[t] *= inv
                o = out[b, i, h * d:(h + 1) * d]
                for j in range(d):
                    o[j] = 0
            # weighted sum, a tile of value rows at a time
            for t0 in range(0, total, _TILE):
                t1 = min(t0 + _TILE, total)
                for h in range(h0, h0 + per):
                    score = scratch[b * n_heads + h]
                    o = out[b, i, h * d:(h + 1) * d]
                    _weighted_rows(o, score, v_cache, kb, g, lo, t0, min(t1, n), d)
                    _weighted_rows(o, score, cross_v, xb, g, -n, max(t0, n), t1, d)


NO_WINDOW = 1 << 40
NO_SINKS = np.zeros(0, dtype=np.float32)
NO_BIAS = np.zeros((0, 0, 0), dtype=np.float32)
NO_CROSS = np.zeros((0, 0, 0), dtype=np.float32)
NO_KEY_END = np.zeros((0, 0), dtype=np.int64)
for _a in (NO_SINKS, NO_BIAS, NO_CROSS, NO_KEY_END):
    _a.flags.writeable = False
NO_KV = np.zeros((0, 0, 0), dtype=np.float32)
"""No keys or values to write: writable like a layer's k and v (it has no element), so both
calls have one signature."""


PARALLEL_TASKS = 4
"""Tasks a thread from which a decode region counts as evenly shared whatever the split
(``_parts``)."""


def _parts(groups: int, group: int, n_threads: int) -> int:
    """Tasks per group of query heads (a divisor of ``group``): the fewest that split the work
    evenly over the threads, or make at least PARALLEL_TASKS tasks a thread (a thread then waits
    at most a small part of the region for the others); each part reads the group's key and
    value rows anew. SmolLM2's 3 groups on 2 threads ran as 2 tasks against 1; as 9 tasks of one
    head, 5 against 4."""
    for parts in range(1, group + 1):
        if group % parts == 0 and ((groups * parts) % n_threads == 0
                                   or groups * parts >= PARALLEL_TASKS * n_threads):
            return parts
    return group


def _ops(dtype, ndim):
    """The row kernel's two team ops (kernels/team.py) for key and value caches of ``dtype``
    and ``ndim`` (``attention_ops``): the step's keys and values written into a self cache, a
    task a batch row; then ``_attend``, a task one (b, kv head, part). Their words (``encode``)
    are attention()'s arguments in its order, a 3-D cache followed by a 0 (five words a cache
    either way)."""

    @njit(cache=True)
    def write(args, k0, k1):
        w = words(args, 70)
        k, v = array3(w, 4, np.float32), array3(w, 8, np.float32)
        slots, positions = array2(w, 52, np.int64), array2(w, 55, np.int64)
        _kv_write(k[k0:k1], v[k0:k1], _cache(w, 12, dtype, ndim), _cache(w, 17, dtype, ndim),
                  array2(w, 26, np.float32), array2(w, 29, np.float32), slots[k0:k1],
                  positions[k0:k1], w[58], w[62], w[63])

    @njit(cache=True)
    def attend(args, k0, k1):
        w = words(args, 70)
        _attend(array3(w, 0, np.float32), _cache(w, 12, dtype, ndim), _cache(w, 17, dtype, ndim),
                array3(w, 22, np.float32), array2(w, 26, np.float32), array2(w, 29, np.float32),
                array1(w, 32, np.float32),
                array3(w, 34, np.float32), array3(w, 38, np.float32), array3(w, 42, np.float32),
                array2(w, 46, np.int64), array2(w, 49, np.float32), array2(w, 52, np.int64),
                array2(w, 55, np.int64), w[58], w[59], w[60], w[61], w[62], w[63], w[64], w[65],
                w[66] != 0, real(args, 67), real(args, 68), w[69], k0, k1)

    return write, attend


def _cache(w, i, dtype, ndim):
    """The cache at words i.. of an op's (ndim 3 or 4, a literal)."""


@overload(_cache, inline="always")
def _cache_of(w, i, dtype, ndim):
    if not isinstance(ndim, types.IntegerLiteral):
        return None  # typed again with the literal the ops pass
    if ndim.literal_value == 4:
        return lambda w, i, dtype, ndim: array4(w, i, dtype)
    return lambda w, i, dtype, ndim: array3(w, i, dtype)


_OPS: dict = {}


def attention_ops(q, k_cache, v_cache, out, cos, sin, scratch, nrows, kv_len, n_heads, n_kv,
                  head_dim, *, scale, window=NO_WINDOW, window_right=None, causal=True,
                  softcap=0.0, sinks=NO_SINKS, bias=NO_BIAS, cross_k=NO_CROSS, cross_v=NO_CROSS,
                  cross_len=0, key_end=NO_KEY_END, slots, positions, k=NO_KV, v=NO_KV,
                  n_threads=None):
    """The row kernel of ``attention`` (its arguments; ``slots`` and ``positions`` as
    ``step_rows`` gives them) as team ops (kernels/team.py): [(address, args, tasks)], the
    cache write first when ``k`` has rows; None when an array is not C-contiguous or of
    another type (float32; int64 slots, positions and key ends; caches float32 or FP16 bits).
    The arrays are read when the ops run: a decode step's program made once reads each step's
    rows (``StageState``). Tasks split each group's heads for ``n_threads`` (``_parts``)."""
    window_right = window if window_right is None else window_right
    floats = (q, k, v, out, cos, sin, scratch, sinks, bias, cross_k, cross_v)
    if (k_cache.ndim not in (3, 4) or k_cache.shape != v_cache.shape
            or k_cache.dtype != v_cache.dtype or k_cache.dtype not in (np.float32, np.uint16)
            or any(a.dtype != np.float32 for a in floats)
            or any(a.dtype != np.int64 for a in (slots, positions, key_end))):
        return None
    n_threads = threads() if n_threads is None else n_threads
    parts = _parts(q.shape[0] * n_kv, n_heads // n_kv, n_threads) if n_threads > 1 else 1
    pad = [0] if k_cache.ndim == 3 else []
    args = encode(q, k, v, k_cache, *pad, v_cache, *pad, out, cos, sin, sinks, bias, cross_k,
                  cross_v, key_end, scratch, slots, positions, nrows, kv_len, cross_len,
                  n_heads, n_kv, head_dim, min(window, NO_WINDOW), min(window_right, NO_WINDOW),
                  int(causal), float(softcap), float(scale), parts)
    if args is None:
        return None
    ops = _OPS.get((k_cache.dtype, k_cache.ndim))
    if ops is None:
        ops = _OPS[k_cache.dtype, k_cache.ndim] = _ops(
            np.float32 if k_cache.dtype == np.float32 else np.uint16, k_cache.ndim)
    attend = (address(ops[1]), args, q.shape[0] * n_kv * parts)
    if k.shape[0] == 0 or k_cache.ndim != 4:
        return [attend]
    return [(address(ops[0]), args, q.shape[0]), attend]


def _write_op(k, v, k_cache, v_cache, cos, sin, slots, positions, nrows, n_kv, head_dim):
    """The cache write of ``attention_ops`` alone (every write of the step's keys runs this one
    compiled copy: two copies of ``_kv_write`` may fuse its multiply-adds differently)."""
    k, v, slots, positions = (np.ascontiguousarray(a) for a in (k, v, slots, positions))
    return attention_ops(k, k_cache, v_cache, k, cos, sin, NO_SCORES, nrows, 0, n_kv, n_kv,
                         head_dim, scale=1.0, slots=slots, positions=positions, k=k, v=v,
                         n_threads=1)[0]


NO_SCORES = np.zeros((0, 0), dtype=np.float32)


def attention(q, k_cache, v_cache, out, cos, sin, scratch, pos0, nrows, kv_len, n_heads, n_kv,
              head_dim, *, scale, window=NO_WINDOW, window_right=None, causal=True,
              softcap=0.0, sinks=NO_SINKS, bias=NO_BIAS, cross_k=NO_CROSS, cross_v=NO_CROSS,
              cross_len=0, key_end=NO_KEY_END, slots=None, positions=None, k=NO_KV, v=NO_KV):
    """out[b, i, h*d:(h+1)*d] = softmax(RoPE(q) . K / ...) V for rows i < nrows (module doc);
    ``window_right`` defaults to ``window``. The caches are float32 or FP16 bits (uint16).
    Given the step's keys and values ``k``, ``v`` (B, H, n_kv * d), the same call first writes
    them into the caches as ``kv_cache_write`` does (one kernel call a decode step, not two).

    A causal step of BLOCKED_MIN_ROWS rows or more over a self cache whose rows see
    BLOCKED_MIN_KEYS keys or more on average runs as blocks of matrix products
    (``attention_blocked``). Any other step runs the row kernel ``_attend`` as the team ops
    ``attention_ops`` give (kernels/team.py), the ones a decode step's program runs: one task
    per (b, kv head), the heads of a group reading each key and value row once, split over
    more tasks when there are fewer such tasks than threads; on the thread pool when there is
    enough work. q is read (into scratch) before out is written, so out may be q.
    """
    window_right = window if window_right is None else window_right
    if not (k_cache.flags.c_contiguous and v_cache.flags.c_contiguous
            and cross_k.flags.c_contiguous and cross_v.flags.c_contiguous):
        raise ValueError("attention: the key and value caches must be C-contiguous (rows are "
                         "read by flat offset)")
    work = q.shape[0] * n_heads * nrows * (min(kv_len, window + window_right) + cross_len) \
        * head_dim
    parallel = work >= PARALLEL_MIN_WORK and threads() > 1  # a region of one thread costs more
    key_end = np.ascontiguousarray(key_end)
    slots, positions = step_rows(q.shape[0], pos0, nrows, k_cache.shape[0], slots, positions)
    if (nrows >= BLOCKED_MIN_ROWS and causal and k_cache.ndim == 4 and bias.shape[0] == 0
            and cross_len == 0 and key_end.shape[0] == 0
            and min(positions[:, 0].min() + nrows // 2, window) >= BLOCKED_MIN_KEYS
            and _runs(slots, positions, nrows)):
        if k.shape[0] > 0:
            Program([_write_op(k, v, k_cache, v_cache, cos, sin, slots, positions, nrows, n_kv,
                               head_dim)]).run(1)
        cos, sin, sinks = read_only(cos), read_only(sin), read_only(sinks)
        attention_blocked(q, k_cache, v_cache, out, cos, sin, slots[:, 0], positions[:, 0],
                          nrows, n_heads, n_kv, head_dim, scale, min(window, NO_WINDOW),
                          softcap, sinks)
        return
    n_threads = threads() if parallel else 1
    ops = attention_ops(q, k_cache, v_cache, out, cos, sin, scratch, nrows, kv_len, n_heads, n_kv,
                        head_dim, scale=scale, window=window, window_right=window_right,
                        causal=causal, softcap=softcap, sinks=sinks, bias=bias, cross_k=cross_k,
                        cross_v=cross_v, cross_len=cross_len, key_end=key_end, slots=slots,
                        positions=positions, k=k, v=v, n_threads=n_threads)
    if ops is None:
        raise ValueError("attention: float32 C-contiguous arrays (int64 rows, caches float32 or "
                         "FP16 bits) expected")
    Program(ops).run(n_threads)


BLOCKED_MIN_ROWS = 32
"""Query rows from which a causal step may run as blocks of matrix products (below)."""
BLOCKED_MIN_KEYS = 256
"""A causal step over a self cache of BLOCKED_MIN_ROWS query rows or more (a prompt) whose rows
see BLOCKED_MIN_KEYS keys or more on average runs as matrix products (``attention_blocked``)
rather than a row at a time: the row kernel reads every key and value row again for each
query row, a block reads them once for BLOCK_ROWS rows, but BLAS over 64 or 256 values a row
starts slowly (docs/performance.md, "Long prompts as blocks of matrix products")."""

BLOCK_ROWS = 64
"""Query rows a block of attention_blocked: its scores (the group's heads x 64 rows x keys)
stay in L2 through the softmax at a few thousand keys."""


def _runs(slots, positions, nrows) -> bool:
    """Whether every batch row's step rows are one sequence's consecutive positions."""
    s, p = slots[:, :nrows], positions[:, :nrows]
    return bool((s == s[:, :1]).all() and (p[:, 1:] - p[:, :-1] == 1).all())


def attention_blocked(q, k_cache, v_cache, out, cos, sin, slots, first, nrows, n_heads, n_kv,
                      head_dim, scale, window, softcap, sinks):
    """``attention`` of a causal step whose batch row b is rows of slot slots[b] at positions
    first[b] + i, i < nrows (a prompt), the step's keys already in the self cache: for each kv
    group and block of BLOCK_ROWS query rows, with numpy's matrix products (BLAS, split over
    the threads) and the float32 softmax of ``_block_softmax``::

        S = RoPE(Q_group) K^T,   P = softmax(S * scale, masked, softcapped, with sinks),   O = P V

    over the keys the block's rows see (from the first row's window start to the last row's
    position), the caches' FP16 rows widened to float32 once a group. Same math as the per-row
    kernel, in another summation order; out may be q (a block reads its rows of q first)."""
    d, group, half = head_dim, n_heads // n_kv, head_dim // 2
    for b in range(q.shape[0]):
        slot, p0 = slots[b], first[b]
        lo0 = max(0, p0 - window + 1)
        for g in range(n_kv):
            keys, values = k_cache[slot, g, lo0:p0 + nrows], v_cache[slot, g, lo0:p0 + nrows]
            if k_cache.dtype == np.uint16:
                keys = keys.view(np.float16).astype(np.float32)
                values = values.view(np.float16).astype(np.float32)
            for r0 in range(0, nrows, BLOCK_ROWS):
                r1 = min(nrows, r0 + BLOCK_ROWS)
                R = r1 - r0
                lo, hi = max(0, p0 + r0 - window + 1) - lo0, p0 + r1 - lo0
                c, s = cos[p0 + r0:p0 + r1], sin[p0 + r0:p0 + r1]
                x = np.empty((group, R, d), np.float32)
                for j in range(group):
                    h = g * group + j
                    a, a2 = q[b, r0:r1, h * d:h * d + half], q[b, r0:r1, h * d + half:(h + 1) * d]
                    x[j, :, :half] = a * c - a2 * s
                    x[j, :, half:] = a2 * c + a * s
                scores = np.empty((group * R, hi - lo), np.float32)
                matmul(x.reshape(group * R, d), keys[lo:hi].T, scores)
                _block_softmax(scores, R, p0 + r0 - lo0 - lo, window, scale, softcap, sinks,
                               g * group)
                o = np.empty((group * R, d), np.float32)
                matmul(scores, values[lo:hi], o)
                for j in range(group):
                    h = g * group + j
                    out[b, r0:r1, h * d:(h + 1) * d] = o[j * R:(j + 1) * R]


@njit(cache=True, parallel=True, fastmath=_FASTMATH, error_model="numpy")
def _block_softmax(scores, R, p, window, scale, softcap, sinks, h0):
    """Row j * R + i of ``scores``: head h0 + j's dot products of the query row i of a block
    with the block's keys, the query at key index p + i of them. Replaced by its softmax over
    the keys it sees (index (p + i) - window < t <= p + i; the rest 0): s * scale, softcapped
    when softcap > 0, the head's sink in the denominator when ``sinks`` has one per head."""
    use_sink = sinks.shape[0] > 0
    for r in prange(scores.shape[0]):
        t1 = p + r % R + 1
        sink = sinks[h0 + r // R] if use_sink else np.float32(-np.inf)
        _softmax_row(scores[r], max(0, t1 - window), t1, np.float32(scale),
                     np.float32(softcap), sink)


@njit(cache=True, fastmath=_FASTMATH, error_model="numpy")
def _softmax_row(row, t0, t1, scale, cap, sink):
    """row[t0:t1] = softmax(s * scale, softcapped when cap > 0, with ``sink`` (-inf: none) in
    the denominator); the rest of the row 0. The loops run over a slice from its index 0, so
    LLVM knows no index is negative and vectorizes them (over row[t0 + t] they ran 15x
    slower); a function of its own (inlined in the prange body, 3.4x slower); the maximum in
    four running maxima (a max that keeps NaN rules does not vectorize)."""
    seg = row[t0:t1]
    n = seg.shape[0]
    if cap > 0:
        for t in range(n):
            seg[t] = np.tanh(seg[t] * scale / cap) * cap
    else:
        for t in range(n):
            seg[t] = seg[t] * scale
    m0 = m1 = m2 = m3 = sink
    for t in range(n // 4):
        m0, m1 = max(m0, seg[4 * t]), max(m1, seg[4 * t + 1])
        m2, m3 = max(m2, seg[4 * t + 2]), max(m3, seg[4 * t + 3])
    for t in range(n - n % 4, n):
        m0 = max(m0, seg[t])
    top = max(max(m0, m1), max(m2, m3))
    denom = np.float32(0.0)
    for t in range(n):
        e = expf(seg[t] - top)
        seg[t] = e
        denom += e
    if sink > -np.inf:
        denom += expf(sink - top)
    inv = np.float32(1.0) / denom
    for t in range(n):
        seg[t] *= inv
    row[:t0] = 0
    row[t1:] = 0


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
                s = np.empty((e - r, nrows), np.float32)
                matmul(q[b, r:e, h * d:(h + 1) * d] * scale, kt, s)
                s -= s.max(axis=1, keepdims=True)
                np.exp(s, out=s)
                s /= s.sum(axis=1, keepdims=True)
                matmul(s, vg, out[b, r:e, h * d:(h + 1) * d])
