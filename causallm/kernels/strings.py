"""Length-prefixed strings stored back to back, as a GGUF file holds an array of strings.

String i is its byte length n_i (8 bytes, unsigned little-endian) followed by its n_i bytes;
string i + 1 starts right after. Finding where each starts is a walk (each length says where
the next one is), which these two functions do in one pass each over plain uint8 arrays:

- ``string_spans(buf, pos, starts, lengths)``: the spans of ``len(starts)`` strings from
  ``buf[pos]`` (``starts[i]``, ``lengths[i]``);
- ``first_not_utf8(buf, starts, lengths)``: the first of them that is not UTF-8
  (``utf8_valid``), or -1.
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
def utf8_valid(buf, a, b):
    """buf[a:b] is UTF-8 (no overlong form, surrogate or code point past U+10FFFF)."""
    p = a
    while p < b:
        c = buf[p]
        if c < 0x80:
            p += 1
            continue
        if 0xC2 <= c <= 0xDF:
            n, lo, hi = 2, 0x80, 0xBF
        elif c == 0xE0:
            n, lo, hi = 3, 0xA0, 0xBF
        elif c == 0xED:
            n, lo, hi = 3, 0x80, 0x9F
        elif 0xE1 <= c <= 0xEF:
            n, lo, hi = 3, 0x80, 0xBF
        elif c == 0xF0:
            n, lo, hi = 4, 0x90, 0xBF
        elif 0xF1 <= c <= 0xF3:
            n, lo, hi = 4, 0x80, 0xBF
        elif c == 0xF4:
            n, lo, hi = 4, 0x80, 0x8F
        else:
            return False
        if p + n > b or not lo <= buf[p + 1] <= hi:
            return False
        for k in range(2, n):
            if not 0x80 <= buf[p + k] <= 0xBF:
                return False
        p += n
    return True



@njit(cache=True)
def first_not_utf8(buf, starts, lengths):
    """The first i whose string buf[starts[i]:starts[i] + lengths[i]] is not UTF-8, or -1."""
    for i in range(starts.shape[0]):
        if not utf8_valid(buf, starts[i], starts[i] + lengths[i]):
            return i
    return -1
