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
