"""Mixture-of-experts kernels for gpt-oss: top-k routing and the clamped GLU of the experts.

Activations are 3-D (B, S, W) float32; a token is addressed by its flat row id t = b * S + r
(r < nrows of the step), so x[t // S, t % S] is its row. Routing (``moe_route``)::

    logits (B, S, E)                 router output, x @ W_router + b_router, rows [0, nrows)
    top   = the k largest logits of the row (ties: lower expert index first)
    w_e   = exp(l_e - max) / sum_{e' in top} exp(l_e' - max)          softmax over the top k
          = softmax(logits)_e / sum_{e' in top} softmax(logits)_e'    (the same numbers)

and it groups the assignments by expert: ``counts[e]`` tokens, their ids ``rows[e, :counts[e]]``
in increasing order and their weights ``coefs[e, :counts[e]]``.

Expert e on the n rows routed to it (gpt-oss's clamped GLU, transformers ``GptOssExperts``)::

    g   = x @ Wg + bg,  u = x @ Wu + bu               (``linear``, on the gathered rows)
    a   = (clip(u, -limit, limit) + 1) * min(g, limit) * sigmoid(alpha * min(g, limit))
                                                      (``clamped_glu``, into g)
    y   = a @ Wd + bd                                 (``linear``)
    out[t] += w * y                                   (``scatter_add_rows``)

sigmoid(z) is computed as 1 / (1 + exp(-z)). Nothing here allocates.
"""

import numpy as np
from numba import njit

from causallm.kernels.expf import expf


@njit(cache=True)
def moe_route(logits, nrows, top, counts, rows, coefs):
    """Top-k softmax routing of rows [0, nrows) of logits (B, S, E), grouped by expert.

    k = top.shape[0] (int32 scratch, k <= E). counts (E,) int32 is overwritten; rows
    (E, >= B*S) int32 and coefs (E, >= B*S) float32 receive, per expert, the flat ids
    t = b*S + r of its tokens (increasing) and their weights.
    """
    B, S, E = logits.shape
    k = top.shape[0]
    for e in range(E):
        counts[e] = 0
    for b in range(B):
        for r in range(nrows):
            lg = logits[b, r]
            for j in range(k):  # selection: the j-th largest not yet taken
                best = -1
                for e in range(E):
                    taken = False
                    for i in range(j):
                        if top[i] == e:
                            taken = True
                    if not taken and (best < 0 or lg[e] > lg[best]):
                        best = e
                top[j] = best
            m = lg[top[0]]
            total = np.float32(0.0)
            for j in range(k):
                total += expf(lg[top[j]] - m)
            t = b * S + r
            for j in range(k):
                e = top[j]
                rows[e, counts[e]] = t
                coefs[e, counts[e]] = expf(lg[e] - m) / total
                counts[e] += 1


@njit(cache=True, error_model="numpy")
def clamped_glu(g, u, n, alpha, limit):
    """g[j] = (clip(u[j], -limit, limit) + 1) * min(g[j], limit) * sigmoid(alpha * min(g[j],
    limit)) for rows j < n of g, u (>= n, I), in place into g."""
    one = np.float32(1.0)
    hi = np.float32(limit)
    lo = -hi
    a = np.float32(alpha)
    for j in range(n):
        gj = g[j]
        uj = u[j]
        for c in range(gj.shape[0]):
            gv = min(gj[c], hi)
            uv = min(max(uj[c], lo), hi)
            gj[c] = (uv + one) * gv / (one + expf(-a * gv))


@njit(cache=True)
def scatter_add_rows(out, rows, coefs, y, n):
    """out[t] += coefs[j] * y[j] for t = rows[j], j < n; out (B, S, H), y (>= n, H)."""
    S = out.shape[1]
    for j in range(n):
        t = rows[j]
        o = out[t // S, t % S]
        yj = y[j]
        w = np.float32(coefs[j])
        for c in range(o.shape[0]):
            o[c] += w * yj[c]
