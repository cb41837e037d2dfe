"""One pass over a tensor's bits for the load-time weight check (causallm/io/weight_check.py).

The bits of an IEEE float without its sign, read as an unsigned integer, order as the
magnitudes; all exponent bits set (an infinity or a NaN) is at least the exponent mask. So the
largest ``bits & ~sign`` of a tensor says both whether it holds a non-finite value
(``>= exponent mask``) and whether it is all zero (``== 0``). An integer max reduction
vectorizes: about 14 GB/s on one core, against 6 GB/s for numpy's isfinite + any in chunks.
"""

from numba import njit


@njit(cache=True)
def max_magnitude_bits(bits, mask):
    """max over i of ``bits[i] & mask`` (bits: 1-D C-contiguous uint16 / uint32 / uint64, a
    float's bits; mask: every bit but the sign); 0 for an empty array."""
    m = mask ^ mask
    for i in range(bits.size):
        m = max(m, bits[i] & mask)
    return m
