"""Mixture-of-experts kernels (Qwen3-MoE): routing and the SwiGLU expert FFN.

Activations are 3-D float32 (B, T, H); a call covers rows [0, nrows) of every batch, and a
token is named by its flat index ``r = b * nrows + t``. With E experts, k experts per token and
expert width I::

    p            = softmax(logits[b, t])                          (E,)
    idx[b, t]    = the k experts of largest p, descending (a tie goes to the lower index)
    weight[b, t] = p[idx] / sum(p[idx])    if normalize   else   p[idx]

    y[b, t] = sum_j weight[b, t, j] * FFN_idx[b,t,j](x[b, t])
    FFN_e(x) = (silu(x @ G_e) * (x @ U_e)) @ D_e         G_e, U_e [H, I], D_e [I, H]
    silu(g)  = g / (1 + exp(-g))

``moe_topk`` routes, ``moe_group`` lists each expert's tokens (so an expert's weights are read
once per step however many tokens chose it), ``expert_ffn`` adds one expert's scaled output to
its tokens' rows. The expert weights come in either layout, like ``linear``:

- ``expert_ffn_io``: G, U (H, I) and D (I, H) C-contiguous, NNTrainer's [in, out] .bin layout;
- ``expert_ffn_oi``: G^T, U^T (I, H) and D^T (H, I) C-contiguous, PyTorch's [out, in] layout.

The numba kernels serve a few rows (decode); from ``BLAS_MIN_ROWS`` rows an expert goes through
numpy's BLAS (prefill). ``fastmath`` lets LLVM reorder the dot-product sums (float32 rounding
differs from a sequential sum); NaN/Inf rules are kept.
"""

import numpy as np
from numba import njit, prange

from causallm.kernels.expf import expf
from causallm.kernels.linear import BLAS_MIN_ROWS
from causallm.kernels.threads import matmul

_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
_COLS = 256  # expert_ffn_io: output columns per parallel task


@njit(cache=True)
def moe_topk(logits, nrows, normalize, idx, weight):
    """Route rows [0, nrows): logits (B, T, E) float32 is replaced by its softmax p;
    idx (B, T, k) int64 gets the k largest p (descending, ties to the lower index) and
    weight (B, T, k) float32 their p, divided by their sum when ``normalize``."""
    B = logits.shape[0]
    E = logits.shape[2]
    k = idx.shape[2]
    for b in range(B):
        for t in range(nrows):
            p = logits[b, t]
            m = p[0]
            for e in range(1, E):
                if p[e] > m:
                    m = p[e]
            s = np.float32(0.0)
            for e in range(E):
                p[e] = expf(p[e] - m)
                s += p[e]
            for e in range(E):
                p[e] = p[e] / s
            total = np.float32(0.0)
            for j in range(k):
                best = -1
                for e in range(E):
                    taken = False
                    for q in range(j):
                        if idx[b, t, q] == e:
                            taken = True
                    if not taken and (best < 0 or p[e] > p[best]):
                        best = e
                idx[b, t, j] = best
                weight[b, t, j] = p[best]
                total += p[best]
            if normalize:
                for j in range(k):
                    weight[b, t, j] = weight[b, t, j] / total


@njit(cache=True)
def moe_group(idx, weight, nrows, starts, rows, scales, hit):
    """Group rows [0, nrows) of idx/weight (B, T, k) by expert; returns n_hit.

    For expert e (E = starts.shape[0] - 1): its tokens are rows[starts[e]:starts[e+1]]
    (flat r = b * nrows + t, ascending) with their routing weights in scales[...] (int64 and
    float32, B * nrows * k long at least); hit[:n_hit] lists the experts with tokens, ascending."""
    B = idx.shape[0]
    k = idx.shape[2]
    E = starts.shape[0] - 1
    pos = 0
    n_hit = 0
    for e in range(E):
        starts[e] = pos
        for b in range(B):
            for t in range(nrows):
                for j in range(k):
                    if idx[b, t, j] == e:
                        rows[pos] = b * nrows + t
                        scales[pos] = weight[b, t, j]
                        pos += 1
        if pos > starts[e]:
            hit[n_hit] = e
            n_hit += 1
    starts[E] = pos
    return n_hit


@njit(cache=True, parallel=True, fastmath=_FASTMATH, error_model="numpy")
def expert_ffn_oi(x, rows, scales, nrows, gate_t, up_t, down_t, h, y):
    """y[b, t] += scales[i] * FFN(x[b, t]) for each token r = rows[i] = b * nrows + t, with
    gate_t, up_t (I, H) and down_t (H, I) C-contiguous [out, in]; h (>= n, I) is scratch.

    Parallel over the I gate/up rows, then over the H down rows; each weight row is read
    once per call and used for every token."""
    n = rows.shape[0]
    I, H = gate_t.shape
    one = np.float32(1.0)
    for j in prange(I):
        g_row = gate_t[j]
        u_row = up_t[j]
        for i in range(n):
            xr = x[rows[i] // nrows, rows[i] % nrows]
            g = np.float32(0.0)
            u = np.float32(0.0)
            for c in range(H):
                g += xr[c] * g_row[c]
                u += xr[c] * u_row[c]
            h[i, j] = g / (one + expf(-g)) * u * scales[i]
    for o in prange(H):
        d_row = down_t[o]
        for i in range(n):
            hr = h[i]
            acc = np.float32(0.0)
            for j in range(I):
                acc += hr[j] * d_row[j]
            y[rows[i] // nrows, rows[i] % nrows, o] += acc


@njit(cache=True, parallel=True, fastmath=_FASTMATH, error_model="numpy")
def expert_ffn_io(x, rows, scales, nrows, gate, up, down, h, u, y):
    """y[b, t] += scales[i] * FFN(x[b, t]) for each token r = rows[i] = b * nrows + t, with
    gate, up (H, I) and down (I, H) C-contiguous [in, out]; h, u (>= n, I) are scratch.

    Parallel over blocks of ``_COLS`` columns: of I for gate/up, then of H for down. Within a
    block, each group of 4 weight rows is read once and added into every token's accumulator
    (h and u, then the token's y row), so the weights are streamed once per call."""
    n = rows.shape[0]
    H, I = gate.shape
    h4, i4 = H - H % 4, I - I % 4
    one = np.float32(1.0)
    for blk in prange((I + _COLS - 1) // _COLS):
        j0 = blk * _COLS
        j1 = min(j0 + _COLS, I)
        for i in range(n):
            for j in range(j0, j1):
                h[i, j] = 0
                u[i, j] = 0
        for c in range(0, H, 4):
            m = 4 if c < h4 else H - c
            for i in range(n):
                xr = x[rows[i] // nrows, rows[i] % nrows]
                hi = h[i, j0:j1]
                ui = u[i, j0:j1]
                if m == 4:
                    x0, x1, x2, x3 = xr[c], xr[c + 1], xr[c + 2], xr[c + 3]
                    g0, g1 = gate[c, j0:j1], gate[c + 1, j0:j1]
                    g2, g3 = gate[c + 2, j0:j1], gate[c + 3, j0:j1]
                    u0, u1 = up[c, j0:j1], up[c + 1, j0:j1]
                    u2, u3 = up[c + 2, j0:j1], up[c + 3, j0:j1]
                    for j in range(j1 - j0):
                        hi[j] += (x0 * g0[j] + x1 * g1[j]) + (x2 * g2[j] + x3 * g3[j])
                        ui[j] += (x0 * u0[j] + x1 * u1[j]) + (x2 * u2[j] + x3 * u3[j])
                else:
                    for cc in range(c, H):
                        xc = xr[cc]
                        gc = gate[cc, j0:j1]
                        uc = up[cc, j0:j1]
                        for j in range(j1 - j0):
                            hi[j] += xc * gc[j]
                            ui[j] += xc * uc[j]
        for i in range(n):
            s = scales[i]
            for j in range(j0, j1):
                g = h[i, j]
                h[i, j] = g / (one + expf(-g)) * u[i, j] * s
    for blk in prange((H + _COLS - 1) // _COLS):
        o0 = blk * _COLS
        o1 = min(o0 + _COLS, H)
        for j in range(0, I, 4):
            for i in range(n):
                hr = h[i]
                yr = y[rows[i] // nrows, rows[i] % nrows, o0:o1]
                if j < i4:
                    h0, h1, h2, h3 = hr[j], hr[j + 1], hr[j + 2], hr[j + 3]
                    d0, d1 = down[j, o0:o1], down[j + 1, o0:o1]
                    d2, d3 = down[j + 2, o0:o1], down[j + 3, o0:o1]
                    for o in range(o1 - o0):
                        yr[o] += (h0 * d0[o] + h1 * d1[o]) + (h2 * d2[o] + h3 * d3[o])
                else:
                    for jj in range(j, I):
                        hv = hr[jj]
                        dj = down[jj, o0:o1]
                        for o in range(o1 - o0):
                            yr[o] += hv * dj[o]


@njit(cache=True, error_model="numpy")
def silu_mul_scale(h, u, scales, n):
    """h[i] = silu(h[i]) * u[i] * scales[i] for rows i < n (the BLAS path's activation)."""
    one = np.float32(1.0)
    for i in range(n):
        s = scales[i]
        for j in range(h.shape[1]):
            g = h[i, j]
            h[i, j] = g / (one + expf(-g)) * u[i, j] * s


def expert_ffn(x, rows, scales, nrows, gate, up, down, h, u, y):
    """y[b, t] += scales[i] * (silu(x[b, t] @ gate) * (x[b, t] @ up)) @ down for every token
    r = rows[i] = b * nrows + t (each token at most once per call).

    gate, up are the logical (H, I) and down the logical (I, H) matrices, each C-contiguous
    ([in, out]) or the transpose view of a C-contiguous [out, in] array; h, u (>= n, I) are
    float32 scratch. Fewer than ``BLAS_MIN_ROWS`` tokens run the numba kernel of the layout;
    more gather their rows and use numpy's BLAS.
    """
    n = rows.shape[0]
    if n < BLAS_MIN_ROWS:
        if gate.flags.c_contiguous and up.flags.c_contiguous and down.flags.c_contiguous:
            expert_ffn_io(x, rows, scales, nrows, gate, up, down, h, u, y)
        elif gate.T.flags.c_contiguous and up.T.flags.c_contiguous and down.T.flags.c_contiguous:
            expert_ffn_oi(x, rows, scales, nrows, gate.T, up.T, down.T, h, y)
        else:
            expert_ffn_io(x, rows, scales, nrows, np.ascontiguousarray(gate),
                          np.ascontiguousarray(up), np.ascontiguousarray(down), h, u, y)
        return
    b, t = np.divmod(rows, nrows)
    xs = x[b, t]                                   # (n, H) gathered token rows
    matmul(xs, gate, h[:n])
    matmul(xs, up, u[:n])
    silu_mul_scale(h, u, scales, n)
    d = np.empty((n, down.shape[1]), np.float32)
    matmul(h[:n], down, d)
    y[b, t] += d                                   # (b, t) pairs are distinct within a call
