"""Rotary position embedding (RoPE) tables: inverse frequencies and cos/sin per position.

Math (rotate-half / NeoX layout, as HF ``rotate_half``): a head vector x of length d is split
into halves a = x[:d/2], b = x[d/2:]; at position p with angle_j = p * inv_freq[j]::

    a' = a * cos(angle) - b * sin(angle)
    b' = b * cos(angle) + a * sin(angle)

The rotation itself runs inside the attention kernels (``attention.py``); this module only
builds, once at init and in plain numpy, the tables those kernels read::

    inv_freq        (d/2,)          float32
    cos, sin        (rows, d/2)     float32, cos[p, j] = cos(float32(p) * inv_freq[j]) * scaling

``rope_inv_freq`` reproduces transformers' init functions (``modeling_rope_utils``
``_compute_*_parameters`` and the models' ``compute_default_rope_parameters``) including
where they round to float32: HF builds ``arange(0, d, 2)`` as float32, raises the base to it
in float32 and takes reciprocals in float32.
"""

import math

import numpy as np

# (inv_freq bytes, attention_scaling, rows) -> (cos, sin); read-only arrays shared by layers
_TABLES = {}


def _pos_freqs(head_dim, theta):
    """theta ** (arange(0, d, 2) / d) rounded to float32, as HF: (d/2,) float32.

    HF raises float32(theta) to a float32 exponent with torch's float32 pow (SLEEF, <= 1 ulp);
    the correctly rounded power (float64 pow, rounded once) equals it in ~98% of entries and is
    within 1 ulp elsewhere. numpy's own float32 power is further off (~20% of entries by 1 ulp).
    """
    exponent = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)  # [d/2] f32
    base = np.float64(np.float32(theta))
    return (base ** exponent.astype(np.float64)).astype(np.float32)                # [d/2]


def _yarn_mscale(scale, mscale=1.0):
    """YaRN attention magnitude correction: 0.1 * mscale * ln(scale) + 1 (1 when scale <= 1)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(head_dim, theta, scaling_type="default", factor=1.0,
                  original_max_position_embeddings=None, low_freq_factor=1.0,
                  high_freq_factor=4.0, beta_fast=32.0, beta_slow=1.0, truncate=True,
                  attention_factor=None, mscale=None, mscale_all_dim=None):
    """Inverse frequencies and attention scaling of one RoPE configuration.

    Returns ``(inv_freq, attention_scaling)``: float32 array of shape (head_dim // 2,) and a
    Python float that multiplies cos and sin. ``scaling_type`` is the HF ``rope_type``:

    - ``"default"``: inv_freq[j] = 1 / theta ** (2j / d); scaling 1.
    - ``"linear"``: the default inv_freq divided by ``factor``; scaling 1.
    - ``"llama3"``: with L = original_max_position_embeddings and wavelen = 2 pi / inv_freq:
      wavelen < L / high_freq_factor keeps inv_freq; wavelen > L / low_freq_factor divides it
      by ``factor``; in between it is blended with
      s = (L / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor) as
      (1 - s) * inv_freq / factor + s * inv_freq. Scaling 1.
    - ``"yarn"``: with corr(r) = d * ln(L / (2 pi r)) / (2 ln theta), low = corr(beta_fast),
      high = corr(beta_slow) (floored / ceiled when ``truncate``), clamped to [0, d - 1];
      ramp[j] = clamp((j - low) / (high - low), 0, 1) and e = 1 - ramp:
      inv_freq = (inv_freq / factor) * (1 - e) + inv_freq * e. Scaling = ``attention_factor``
      if given, else mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are
      set (non-zero), else mscale(factor) = 0.1 ln(factor) + 1 (1 if factor <= 1).

    NNTrainer's own YaRN (``mha_core``; docs/nntrainer.md, "mha_core") is this formula with
    ``truncate=False``, beta 32/1 and scaling mscale(factor). HF's ``"dynamic"`` and
    ``"longrope"`` depend on the sequence length and are not supported here; HF's
    ``factor=None`` case (factor derived from max_position_embeddings) is the caller's job.
    """
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"rope_inv_freq: head_dim must be a positive even number, got {head_dim}")
    pos_freqs = _pos_freqs(head_dim, theta)                                      # [d/2]
    inv_freq = np.float32(1) / pos_freqs                                         # [d/2]
    if scaling_type == "default":
        return inv_freq, 1.0
    if scaling_type == "linear":
        return inv_freq / np.float32(factor), 1.0
    if scaling_type == "llama3":
        if original_max_position_embeddings is None:
            raise ValueError("rope_inv_freq: llama3 scaling needs original_max_position_embeddings")
        old_len = original_max_position_embeddings
        low_freq_wavelen = old_len / low_freq_factor
        high_freq_wavelen = old_len / high_freq_factor
        # torch evaluates `scalar / tensor` as reciprocal(tensor) * float32(scalar)
        wavelen = (np.float32(1) / inv_freq) * np.float32(2 * math.pi)           # [d/2]
        scaled = np.where(wavelen > np.float32(low_freq_wavelen),
                          inv_freq / np.float32(factor), inv_freq)               # [d/2]
        smooth = (((np.float32(1) / wavelen) * np.float32(old_len) - np.float32(low_freq_factor))
                  / np.float32(high_freq_factor - low_freq_factor))              # [d/2]
        smoothed = ((np.float32(1) - smooth) * scaled / np.float32(factor)
                    + smooth * scaled)                                           # [d/2]
        medium = ~(wavelen < np.float32(high_freq_wavelen)) & ~(wavelen > np.float32(low_freq_wavelen))
        return np.where(medium, smoothed, scaled).astype(np.float32), 1.0
    if scaling_type == "yarn":
        if original_max_position_embeddings is None:
            raise ValueError("rope_inv_freq: yarn scaling needs original_max_position_embeddings")
        if attention_factor is None:
            if mscale and mscale_all_dim:
                attention_factor = float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim))
            else:
                attention_factor = _yarn_mscale(factor)
        beta_fast = beta_fast or 32
        beta_slow = beta_slow or 1

        def correction_dim(rotations):
            return (head_dim * math.log(original_max_position_embeddings / (rotations * 2 * math.pi))
                    / (2 * math.log(theta)))

        low = correction_dim(beta_fast)
        high = correction_dim(beta_slow)
        if truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        if low == high:
            high += 0.001  # as HF: avoid dividing by zero
        ramp = ((np.arange(head_dim // 2, dtype=np.float32) - np.float32(low))
                / np.float32(high - low))                                        # [d/2]
        extrapolation = np.float32(1) - np.clip(ramp, np.float32(0), np.float32(1))  # [d/2]
        inv_inter = np.float32(1) / (np.float32(factor) * pos_freqs)             # [d/2]
        inv_freq = (inv_inter * (np.float32(1) - extrapolation)
                    + inv_freq * extrapolation)                                  # [d/2]
        return inv_freq.astype(np.float32), float(attention_factor)
    raise ValueError(f"rope_inv_freq: unsupported RoPE scaling type {scaling_type!r}; "
                     "expected one of default, linear, llama3, yarn")


def rope_tables(inv_freq, attention_scaling, rows):
    """cos and sin tables for positions [0, rows): two read-only float32 (rows, d/2) arrays.

    cos[p, j] = cos(float32(p) * inv_freq[j]) * attention_scaling (likewise sin). The angle is
    the float32 product, as HF forms it; cos/sin are evaluated in float64 and rounded once,
    then scaled in float32. Results are cached by (inv_freq bytes, attention_scaling, rows),
    so layers with the same settings share one table and layers with different settings get
    their own (unlike NNTrainer's process-global table: docs/nntrainer.md, "One RoPE table for
    every layer").
    """
    inv_freq = np.ascontiguousarray(inv_freq, dtype=np.float32)
    key = (inv_freq.tobytes(), float(attention_scaling), int(rows))
    tables = _TABLES.get(key)
    if tables is None:
        angle = np.arange(rows, dtype=np.float32)[:, None] * inv_freq[None, :]   # [rows, d/2] f32
        scaling = np.float32(attention_scaling)
        cos = np.cos(angle.astype(np.float64)).astype(np.float32) * scaling     # [rows, d/2]
        sin = np.sin(angle.astype(np.float64)).astype(np.float32) * scaling     # [rows, d/2]
        cos.setflags(write=False)
        sin.setflags(write=False)
        tables = _TABLES[key] = (cos, sin)
    return tables
