"""Length-prefixed strings stored back to back, as a GGUF file holds an array of strings.

String i is its byte length n_i (8 bytes, unsigned little-endian) followed by its n_i bytes;
string i + 1 starts right after. Finding where each starts is a walk (each length says where
the next one is), which these two functions do in one pass each over plain uint8 arrays:

- ``string_spans(buf, pos, starts, lengths)``: the spans of ``len(starts)`` strings from
  ``buf[pos]`` (``starts[i]``, ``lengths[i]``);
- ``join_strings(buf, starts, lengths, out)``: their bytes copied to ``out``, each followed by
  a 0 byte, so one UTF-8 decode and one split on NUL give every string (when none holds a 0).
"""

import numpy as np
from numba import njit


@njit(cache=True)
def string_spans(buf, pos, starts, lengths):
    """starts[i], lengths[i] of the len(starts) strings stored from buf[pos] (module docstring).

    Returns the position just past the last string, or -1 - i when string i (its length or
    its bytes) runs past the end of buf."""
    n = buf.shape[0]
    for i in range(starts.shape[0]):
        if pos > n - 8:
            return -1 - i
        length = np.int64(0)
        for k in range(8):
            length |= np.int64(buf[pos + k]) << (8 * k)  # a top byte >= 0x80 reads as < 0
        pos += 8
        if length < 0 or length > n - pos:
            return -1 - i
        starts[i] = pos
        lengths[i] = length
        pos += length
    return pos


@njit(cache=True)
def join_strings(buf, starts, lengths, out):
    """out = bytes of string 0, 0, bytes of string 1, 0, ... (len(out) = sum(lengths) +
    len(starts)); returns how many 0 bytes the strings themselves hold."""
    o = 0
    zeros = 0
    for i in range(starts.shape[0]):
        s = starts[i]
        for k in range(lengths[i]):
            b = buf[s + k]
            out[o + k] = b
            if b == 0:
                zeros += 1
        o += lengths[i]
        out[o] = 0
        o += 1
    return zeros


_B = np.uint64(0x100000001B3)       # the polynomial hash's base (odd: every power is invertible)
_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: a hash's top bits pick its slot


@njit(cache=True)
def _same(cps, a, n, b):
    """cps[a:a+n] == cps[b:b+n]."""
    for k in range(n):
        if cps[a + k] != cps[b + k]:
            return False
    return True


@njit(cache=True)
def _find(hashes, ids, shift, cps, starts, lengths, h, s, n):
    """The token of the table (``hashes``, ``ids``) spelled cps[s:s+n] (hash h), or -1."""
    mask = ids.shape[0] - 1
    slot = np.int64((h * _MIX) >> shift)
    while True:
        t = ids[slot]
        if t < 0:
            return -1
        if hashes[slot] == h and lengths[t] == n and _same(cps, starts[t], n, s):
            return t
        slot = (slot + 1) & mask


@njit(cache=True)
def bpe_splits(cps, starts, lengths, last, out_token, out_left, out_right):
    """The pairs of tokens each token splits into (the merges a SentencePiece vocabulary
    implies). Token i is spelled by the code points cps[starts[i]:starts[i] + lengths[i]].

    ``last[i]`` gets the last token spelled as token i (a vocabulary's id of that spelling).
    For each token i that is the first of its spelling, in order, and each k in [1, L) where
    both its first k code points and the other L - k spell tokens, one row: out_token = i,
    out_left / out_right = the last tokens spelled so. Returns the number of rows (at most
    sum(L - 1)). Spellings are found in a hash table (polynomial hashes of the code points
    mod 2^64, open addressing, a hit compared code point by code point)."""
    n = starts.shape[0]
    bits = 1
    while (1 << bits) < 2 * n:
        bits += 1
    shift = np.uint64(64 - bits)
    ids = np.full(1 << bits, -1, np.int64)
    hashes = np.zeros(1 << bits, np.uint64)
    mask = ids.shape[0] - 1
    longest = 0
    for i in range(n):
        longest = max(longest, lengths[i])
    pw = np.empty(longest + 1, np.uint64)
    pw[0] = np.uint64(1)
    for k in range(longest):
        pw[k + 1] = pw[k] * _B
    first = np.zeros(n, np.bool_)
    for i in range(n):
        s, L = starts[i], lengths[i]
        h = np.uint64(0)
        for k in range(L):
            h = h * _B + np.uint64(cps[s + k])
        slot = np.int64((h * _MIX) >> shift)
        while True:
            t = ids[slot]
            if t < 0:
                first[i] = True
                break
            if hashes[slot] == h and lengths[t] == L and _same(cps, starts[t], L, s):
                break
            slot = (slot + 1) & mask
        ids[slot] = i  # a later token of the same spelling takes its place
        hashes[slot] = h
    prefix = np.empty(longest + 1, np.uint64)
    rows = 0
    for i in range(n):
        s, L = starts[i], lengths[i]
        prefix[0] = np.uint64(0)
        for k in range(L):
            prefix[k + 1] = prefix[k] * _B + np.uint64(cps[s + k])
        last[i] = _find(hashes, ids, shift, cps, starts, lengths, prefix[L], s, L)
        if not first[i]:
            continue
        for k in range(1, L):
            left = _find(hashes, ids, shift, cps, starts, lengths, prefix[k], s, k)
            if left < 0:
                continue
            right = _find(hashes, ids, shift, cps, starts, lengths,
                          prefix[L] - prefix[k] * pw[L - k], s + k, L - k)
            if right < 0:
                continue
            out_token[rows] = i
            out_left[rows] = left
            out_right[rows] = right
            rows += 1
    return rows
