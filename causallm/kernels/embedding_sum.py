"""Token-type + learned absolute position embeddings, added (BERT's ``BertEmbeddings`` sum).

    y[b, i] = (x[b, i] + type_row) + table[pos0 + i]      i in [0, nrows); no type_row if empty

Shapes: x, y (B, H, W) float32, rows [0, nrows); table (P, W) with pos0 + nrows <= P (the
caller checks); type_row (W,) or (0,). The order of the two adds is HF's
(``inputs_embeds + token_type_embeddings``, then ``+= position_embeddings``). y may be x.
"""

from numba import njit


@njit(cache=True)
def position_add(x, table, type_row, y, nrows, positions, offset):
    """y[b, i] = (x[b, i] + type_row) + table[offset + positions[b, i]] for i < nrows; no
    type_row if empty."""
    W = x.shape[2]
    typed = type_row.shape[0] == W
    for b in range(x.shape[0]):
        for i in range(nrows):
            xr = x[b, i]
            yr = y[b, i]
            pr = table[offset + positions[b, i]]
            if typed:
                for j in range(W):
                    yr[j] = (xr[j] + type_row[j]) + pr[j]
            else:
                for j in range(W):
                    yr[j] = xr[j] + pr[j]
