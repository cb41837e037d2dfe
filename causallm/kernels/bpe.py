"""Byte-pair encoding on arrays: a vocabulary of byte strings, its hash tables, a trie of added
tokens, the merges of a word, and decoding (causallm/io/gguf_tokenizer.py drives them).

**The vocabulary.** Token t is spelled ``data[offsets[t]:offsets[t + 1]]`` (UTF-8).
``table`` is an open-addressing hash table of the spellings: spelling s with hash
``h(s) = sum s[k] * B^(len - 1 - k) mod 2^64`` sits at the slot the top bits of ``h(s) * MIX``
pick (or the next free one: linear probing) as ``token << 32 | (h(s) mod 2^32)`` (-1: free), a
hit compared byte by byte. A spelling held by several tokens finds the last of them, the
spelling's *live* id (what a dict of the spellings keeps), and ``first[t]`` is the first token
of t's spelling. ``flags[t]``: LIVE, SPECIAL (t's spelling is a control token's).

**Added tokens** (control and user-defined) are matched in the raw text before anything else,
leftmost first and longest at a position (what an Aho-Corasick automaton of kind
LeftmostLongest finds): a trie of their bytes, ``trie_root[b]`` the node after byte b, then
node n --b--> the child stored under key n * 256 + b in a hash table, ``trie_token[n]`` the
token a node ends (-1: none).

**Merges.** A pair of adjacent symbols (l, r) merges into token m with a rank; lower ranks
merge first. Byte-level vocabularies list their merges: the hash table ``merge_keys`` (l * 2^32
+ r) -> ``merge_rank``, ``merge_new``, a later merge of the same pair replacing an earlier one.
A SentencePiece vocabulary's merges are every split of every token into two tokens, ranked by
the token's score (best first), then the longer left piece, then the longer right, then the
token's first place in the vocabulary; they are not listed: (l, r) merges when the spelling
of l then r is a token m (looked up by ``h(l r) = h(l) * B^len(r) + h(r)``), with rank
``((score_rank[m] * W + M - chars(l)) * W + M - chars(r)) * (n + 1) + first[m]`` (M the
longest spelling in bytes, W = M + 1, n tokens), which orders pairs as that list does.

**A word** (``_word``): each character is the token of its spelling; else, with byte fallback,
the tokens ``<0xNN>`` of its bytes when all exist; else the unknown token (consecutive unknown
characters fused into one; a byte-fallback character does not end the run), or nothing. Then,
as ``tokenizers``' BPE (``Word::merge_all``): a min-heap of (rank, position) of the pairs;
pop the lowest (leftmost on ties), skip it if its left symbol is gone, is last, or its pair
no longer merges into the same token (a pair changes only by growing, so: when the two
spellings no longer add up to that token's length); else merge, and push the new pairs with
the left and right neighbours.

**Decoding** (``decode_ids``): a SentencePiece vocabulary's tokens with ``▁`` as a space; a run
of byte tokens ``<0xNN>`` (also ``<0x+N>``, as Rust's u8::from_str_radix reads it) becomes its
bytes when they are UTF-8, else one U+FFFD per byte (``tokenizers``' ByteFallback). A
byte-level vocabulary's tokens: each character's byte under GPT-2's table (a token with a
character outside it: its own UTF-8).
"""

from collections import namedtuple

import numpy as np
from numba import njit

from causallm.kernels.strings import utf8_valid

_B = np.uint64(0x100000001B3)       # the polynomial hash's base
_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: a hash's top bits pick its slot
_LOW = np.uint64(0xFFFFFFFF)

LIVE, SPECIAL = np.uint8(1), np.uint8(2)
AS_IS, GEMMA_SPACES, BYTE_LEVEL = 0, 1, 2
"""How ``build_vocab`` spells the file's tokens: as they are; GEMMA_SPACES: a token of spaces
only (U+0020) as that many ``▁``; BYTE_LEVEL: a token with a character outside GPT-2's byte
alphabet by the characters of its UTF-8 bytes."""
CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values


def _gpt2_bytes() -> np.ndarray:
    """GPT-2's byte -> character table (code points) of byte-level vocabularies."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    table, extra = np.empty(256, np.int32), 0
    for b in range(256):
        if b in keep:
            table[b] = b
        else:
            table[b] = 256 + extra
            extra += 1
    return table


BYTE_CHARS = _gpt2_bytes()
CHAR_BYTES = np.full(int(BYTE_CHARS.max()) + 1, -1, np.int32)
CHAR_BYTES[BYTE_CHARS] = np.arange(256, dtype=np.int32)
_SPACE_MARK = np.array([0xE2, 0x96, 0x81], np.uint8)  # U+2581 ▁
_HEX_DIGITS = np.frombuffer(b"0123456789ABCDEF", np.uint8).copy()

Vocab = namedtuple("Vocab", [
    "data", "offsets", "table", "shift", "first", "flags", "byte_ids", "pw", "max_bytes",
    "trie_root", "trie_keys", "trie_child", "trie_token", "trie_shift", "score_rank",
    "merge_keys", "merge_rank", "merge_new", "merge_shift"])
"""Everything the encoding and decoding kernels read (module docstring); ``shift`` and the
other ``*_shift`` are 64 - log2 of their table's size, ``pw[k]`` = B^k, ``max_bytes`` the
longest spelling; an empty ``first`` or ``score_rank`` stands for the identity (no spelling held
twice; scores in file order)."""


# ----------------------------------------------------------------------------- hashing
@njit(cache=True)
def _hash(buf, s, n):
    h = np.uint64(0)
    for k in range(n):
        h = h * _B + np.uint64(buf[s + k])
    return h


@njit(cache=True)
def _same(a, sa, b, sb, n):
    """a[sa:sa+n] == b[sb:sb+n]."""
    for k in range(n):
        if a[sa + k] != b[sb + k]:
            return False
    return True


@njit(cache=True)
def _find(data, offsets, table, shift, buf, s, n, h):
    """The live token spelled buf[s:s+n] (hash h), or -1."""
    mask = table.shape[0] - 1
    tag = np.int64(h & _LOW)
    slot = np.int64((h * _MIX) >> np.uint64(shift))
    while True:
        e = table[slot]
        if e < 0:
            return -1
        if e & 0xFFFFFFFF == tag:
            t = e >> 32
            if offsets[t + 1] - offsets[t] == n and _same(data, offsets[t], buf, s, n):
                return t
        slot = (slot + 1) & mask


@njit(cache=True)
def _find_pair(data, offsets, table, shift, left, right, h):
    """The live token spelled as token ``left`` then token ``right`` (hash h), or -1."""
    a, na = offsets[left], offsets[left + 1] - offsets[left]
    b, nb = offsets[right], offsets[right + 1] - offsets[right]
    mask = table.shape[0] - 1
    tag = np.int64(h & _LOW)
    slot = np.int64((h * _MIX) >> np.uint64(shift))
    while True:
        e = table[slot]
        if e < 0:
            return -1
        if e & 0xFFFFFFFF == tag:
            t = e >> 32
            s = offsets[t]
            if offsets[t + 1] - s == na + nb and _same(data, s, data, a, na) and \
                    _same(data, s + na, data, b, nb):
                return t
        slot = (slot + 1) & mask


@njit(cache=True)
def _bits(n):
    """log2 of a hash table's size for n entries: the smallest power of two >= 1.5 n + 16."""
    bits = 4
    while (1 << bits) < n + n // 2 + 16:
        bits += 1
    return bits


@njit(cache=True)
def _utf8_length(lead):
    """Bytes of the UTF-8 character whose first byte is ``lead`` (of valid UTF-8)."""
    if lead < 0x80:
        return 1
    if lead < 0xE0:
        return 2
    if lead < 0xF0:
        return 3
    return 4


@njit(cache=True)
def _code_point(buf, p, n):
    c = np.int64(buf[p])
    if n == 1:
        return c
    c &= (0x1F, 0x0F, 0x07)[n - 2]
    for k in range(1, n):
        c = (c << 6) | (np.int64(buf[p + k]) & 0x3F)
    return c


@njit(cache=True)
def _chars(buf, s, n):
    """Characters of the UTF-8 buf[s:s+n]."""
    count = 0
    for k in range(n):
        if buf[s + k] & 0xC0 != 0x80:
            count += 1
    return count


# ----------------------------------------------------------------------------- building
@njit(cache=True)
def _mark(out, o):
    """out[o:o+3] = ▁ (U+2581) in UTF-8 (element by element: numba compiles a slice assignment
    from an array for seconds)."""
    out[o], out[o + 1], out[o + 2] = 0xE2, 0x96, 0x81


@njit(cache=True)
def _spelled_length(raw, s, n, mode):
    """Bytes of token raw[s:s+n] as ``mode`` spells it."""
    if mode == GEMMA_SPACES:
        for k in range(n):
            if raw[s + k] != 0x20:
                return n
        return 3 * n
    if mode == BYTE_LEVEL:
        p, e = s, s + n
        while p < e:
            L = _utf8_length(raw[p])
            c = _code_point(raw, p, L)
            if c >= CHAR_BYTES.shape[0] or CHAR_BYTES[c] < 0:
                total = 0
                for k in range(n):
                    total += 1 if BYTE_CHARS[raw[s + k]] < 0x80 else 2
                return total
            p += L
    return n


@njit(cache=True)
def _spell(raw, s, n, mode, out, o, m):
    """Write token raw[s:s+n] as ``mode`` spells it (in m bytes, ``_spelled_length``) at
    out[o:o+m]."""
    if m == n:
        for k in range(n):
            out[o + k] = raw[s + k]
    elif mode == GEMMA_SPACES:
        for k in range(n):
            _mark(out, o + 3 * k)
    else:
        q = o
        for k in range(n):
            c = BYTE_CHARS[raw[s + k]]
            if c < 0x80:
                out[q] = c
                q += 1
            else:
                out[q] = 0xC0 | (c >> 6)
                out[q + 1] = 0x80 | (c & 0x3F)
                q += 2


@njit(cache=True)
def build_vocab(raw, starts, lengths, types, mode):
    """The vocabulary of tokens raw[starts[i]:starts[i] + lengths[i]] (UTF-8) as ``mode``
    spells them (AS_IS, GEMMA_SPACES, BYTE_LEVEL), with its tables (module docstring);
    ``types`` are the tokens' tokenizer.ggml.token_type values (CONTROL and USER_DEFINED tokens
    go into the trie; a CONTROL token's spelling is SPECIAL).

    Returns (data, offsets, table, shift, first, flags, byte_ids, pw, max_bytes, trie_root,
    trie_keys, trie_child, trie_token, trie_shift); ``byte_ids[b]`` is the live token spelled
    ``<0xNN>`` (NN byte b in upper-case hex), or -1."""
    n = starts.shape[0]
    offsets = np.zeros(n + 1, np.int64)
    for i in range(n):
        offsets[i + 1] = offsets[i] + _spelled_length(raw, starts[i], lengths[i], mode)
    data = np.empty(offsets[n], np.uint8)
    max_bytes = 0
    for i in range(n):
        _spell(raw, starts[i], lengths[i], mode, data, offsets[i], offsets[i + 1] - offsets[i])
        max_bytes = max(max_bytes, offsets[i + 1] - offsets[i])
    bits = _bits(n)
    shift = 64 - bits
    table = np.full(1 << bits, -1, np.int64)
    first = np.empty(n, np.int32)
    mask = table.shape[0] - 1
    for i in range(n):
        s, L = offsets[i], offsets[i + 1] - offsets[i]
        h = _hash(data, s, L)
        tag = np.int64(h & _LOW)
        slot = np.int64((h * _MIX) >> np.uint64(shift))
        first[i] = i
        while table[slot] >= 0:
            t = table[slot] >> 32
            if table[slot] & 0xFFFFFFFF == tag and offsets[t + 1] - offsets[t] == L and \
                    _same(data, offsets[t], data, s, L):
                first[i] = first[t]
                break
            slot = (slot + 1) & mask
        table[slot] = (np.int64(i) << 32) | tag  # a later token of a spelling takes its place
    flags = np.zeros(n, np.uint8)
    for slot in range(table.shape[0]):
        if table[slot] >= 0:
            flags[table[slot] >> 32] = LIVE
    twice = False
    for i in range(n):
        twice = twice or first[i] != i
    if not twice:
        first = np.empty(0, np.int32)  # every token the first of its spelling: the identity
    pw = np.empty(max_bytes + 1, np.uint64)
    pw[0] = np.uint64(1)
    for k in range(max_bytes):
        pw[k + 1] = pw[k] * _B
    name = np.empty(6, np.uint8)  # <0xNN>
    name[0], name[1], name[2], name[5] = 0x3C, 0x30, 0x78, 0x3E
    byte_ids = np.empty(256, np.int32)
    for b in range(256):
        name[3], name[4] = _HEX_DIGITS[b >> 4], _HEX_DIGITS[b & 15]
        byte_ids[b] = _find(data, offsets, table, shift, name, 0, 6, _hash(name, 0, 6))
    # the trie of the added tokens
    total = 0
    for i in range(n):
        if types[i] == CONTROL or types[i] == USER_DEFINED:
            total += offsets[i + 1] - offsets[i]
    trie_bits = _bits(total)
    trie_shift = 64 - trie_bits
    trie_root = np.full(256, -1, np.int32)
    trie_keys = np.full(1 << trie_bits, -1, np.int64)
    trie_child = np.empty(1 << trie_bits, np.int32)
    trie_token = np.full(total + 1, -1, np.int32)
    trie_mask = trie_keys.shape[0] - 1
    nodes = 1
    for i in range(n):
        if types[i] != CONTROL and types[i] != USER_DEFINED:
            continue
        s, L = offsets[i], offsets[i + 1] - offsets[i]
        if L == 0:
            continue  # an empty added token is ignored
        live = _find(data, offsets, table, shift, data, s, L, _hash(data, s, L))
        if types[i] == CONTROL:
            flags[live] |= SPECIAL
        node = trie_root[data[s]]
        if node < 0:
            node = nodes
            nodes += 1
            trie_root[data[s]] = node
        for k in range(1, L):
            key = np.int64(node) * 256 + data[s + k]
            slot = np.int64((np.uint64(key) * _MIX) >> np.uint64(trie_shift))
            while trie_keys[slot] >= 0 and trie_keys[slot] != key:
                slot = (slot + 1) & trie_mask
            if trie_keys[slot] < 0:
                trie_keys[slot] = key
                trie_child[slot] = nodes
                nodes += 1
            node = trie_child[slot]
        trie_token[node] = live
    return (data, offsets, table, shift, first, flags, byte_ids, pw, max_bytes, trie_root,
            trie_keys, trie_child, trie_token, trie_shift)


@njit(cache=True)
def build_merges(data, offsets, table, shift, raw, starts, lengths):
    """The merge table of merges raw[starts[i]:starts[i] + lengths[i]] ("left right", split at
    the first space; rank i) over the vocabulary (data, offsets, table).

    Returns (merge_keys, merge_rank, merge_new, merge_shift, bad): ``bad`` is -1, or the first
    merge that has no space or whose left, right or joined spelling is not a token."""
    m = starts.shape[0]
    bits = _bits(m)
    keys = np.full(1 << bits, -1, np.int64)
    rank = np.empty(1 << bits, np.int32)
    new = np.empty(1 << bits, np.int32)
    mask = keys.shape[0] - 1
    for i in range(m):
        s, e = starts[i], starts[i] + lengths[i]
        sp = s
        while sp < e and raw[sp] != 0x20:
            sp += 1
        if sp == e:
            return keys, rank, new, 64 - bits, i
        left = _find(data, offsets, table, shift, raw, s, sp - s, _hash(raw, s, sp - s))
        right = _find(data, offsets, table, shift, raw, sp + 1, e - sp - 1,
                      _hash(raw, sp + 1, e - sp - 1))
        if left < 0 or right < 0:
            return keys, rank, new, 64 - bits, i
        h = _hash(raw, s, sp - s) * _power(e - sp - 1) + _hash(raw, sp + 1, e - sp - 1)
        joined = _find_pair(data, offsets, table, shift, left, right, h)
        if joined < 0:
            return keys, rank, new, 64 - bits, i
        key = (np.int64(left) << 32) | right
        slot = np.int64((np.uint64(key) * _MIX) >> np.uint64(64 - bits))
        while keys[slot] >= 0 and keys[slot] != key:
            slot = (slot + 1) & mask
        keys[slot], rank[slot], new[slot] = key, i, joined
    return keys, rank, new, 64 - bits, -1


@njit(cache=True)
def _power(k):
    p = np.uint64(1)
    for _ in range(k):
        p = p * _B
    return p


# ----------------------------------------------------------------------------- a word
# The hot helpers take the vocabulary's arrays one by one: handing numba a tuple of arrays costs
# a reference count per array and call.
@njit(cache=True)
def _merge(spm, data, offsets, table, shift, pw, max_bytes, score_rank, first, merge_keys,
           merge_rank, merge_new, merge_shift, ids, blen, hashes, chars, i, j):
    """(rank, merged token) of adjacent symbols i, j, or (-1, -1) when they do not merge."""
    if not spm:
        key = (np.int64(ids[i]) << 32) | ids[j]
        mask = merge_keys.shape[0] - 1
        slot = np.int64((np.uint64(key) * _MIX) >> np.uint64(merge_shift))
        while merge_keys[slot] >= 0:
            if merge_keys[slot] == key:
                return np.int64(merge_rank[slot]), np.int64(merge_new[slot])
            slot = (slot + 1) & mask
        return np.int64(-1), np.int64(-1)
    if blen[i] + blen[j] > max_bytes:
        return np.int64(-1), np.int64(-1)
    m = _find_pair(data, offsets, table, shift, ids[i], ids[j],
                   hashes[i] * pw[blen[j]] + hashes[j])
    if m < 0:
        return np.int64(-1), np.int64(-1)
    score = np.int64(m if score_rank.shape[0] == 0 else score_rank[m])
    place = np.int64(m if first.shape[0] == 0 else first[m])
    width = max_bytes + 1  # > any token's characters
    rank = ((score * width + (max_bytes - chars[i])) * width + (max_bytes - chars[j])) * \
        offsets.shape[0] + place  # offsets: tokens + 1 > any place
    return rank, np.int64(m)


@njit(cache=True)
def _symbol(spm, data, offsets, t, k, ids, blen, hashes, chars):
    """Symbol k is token t."""
    s, n = offsets[t], offsets[t + 1] - offsets[t]
    ids[k], blen[k] = t, n
    if spm:
        hashes[k], chars[k] = _hash(data, s, n), _chars(data, s, n)


@njit(cache=True)
def _push(keys, pos, new, size, key, p, m):
    """Add (key, p) -> m to the min-heap of ``size`` entries ordered by (key, p)."""
    i = size
    while i > 0:
        up = (i - 1) >> 1
        if keys[up] < key or (keys[up] == key and pos[up] <= p):
            break
        keys[i], pos[i], new[i] = keys[up], pos[up], new[up]
        i = up
    keys[i], pos[i], new[i] = key, p, m
    return size + 1


@njit(cache=True)
def _pop(keys, pos, new, size):
    """Remove the heap's first entry (read it before); returns the new size."""
    size -= 1
    key, p, m = keys[size], pos[size], new[size]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and (keys[c + 1] < keys[c] or (keys[c + 1] == keys[c] and
                                                        pos[c + 1] < pos[c])):
            c += 1
        if key < keys[c] or (key == keys[c] and p <= pos[c]):
            break
        keys[i], pos[i], new[i] = keys[c], pos[c], new[c]
        i = c
    keys[i], pos[i], new[i] = key, p, m
    return size


@njit(cache=True)
def _word(w, a, b, spm, unk, data, offsets, table, shift, byte_ids, pw, max_bytes, score_rank,
          first, merge_keys, merge_rank, merge_new, merge_shift, scratch, out, o):
    """The tokens of the word w[a:b] (UTF-8) written to out[o:]; returns the end (module
    docstring). ``spm``: SentencePiece merges and byte fallback, else listed merges; ``unk``
    the unknown token or -1; ``scratch`` (``_scratch``) for b - a symbols."""
    ids, prev, next_, blen, hashes, chars, keys, pos, new = scratch
    m = 0
    pending = False  # an unknown character not yet written
    p = a
    while p < b:
        L = min(_utf8_length(w[p]), b - p)
        h = _hash(w, p, L)
        t = _find(data, offsets, table, shift, w, p, L, h)
        if t >= 0:
            if pending:
                _symbol(spm, data, offsets, unk, m, ids, blen, hashes, chars)
                m += 1
                pending = False
            ids[m], blen[m], hashes[m], chars[m] = t, L, h, 1  # spelled as the character
            m += 1
        else:
            fallback = spm
            for k in range(L):
                if fallback and byte_ids[w[p + k]] < 0:
                    fallback = False
            if fallback:
                for k in range(L):
                    _symbol(spm, data, offsets, byte_ids[w[p + k]], m, ids, blen, hashes, chars)
                    m += 1
            elif unk >= 0:
                pending = True
        p += L
    if pending:
        _symbol(spm, data, offsets, unk, m, ids, blen, hashes, chars)
        m += 1
    if m == 0:
        return o
    for k in range(m):
        prev[k], next_[k] = k - 1, k + 1
    next_[m - 1] = -1
    size = 0
    for k in range(m - 1):
        rank, merged = _merge(spm, data, offsets, table, shift, pw, max_bytes, score_rank, first,
                              merge_keys, merge_rank, merge_new, merge_shift, ids, blen, hashes,
                              chars, k, k + 1)
        if merged >= 0:
            size = _push(keys, pos, new, size, rank, k, merged)
    while size > 0:
        k, merged = pos[0], new[0]
        size = _pop(keys, pos, new, size)
        j = next_[k]
        # gone, last, or a pair that changed since: a pair only changes by growing, so it still
        # merges into ``merged`` exactly when its spellings still add up to merged's length
        if ids[k] < 0 or j < 0 or blen[k] + blen[j] != offsets[merged + 1] - offsets[merged]:
            continue
        if spm:
            hashes[k] = hashes[k] * pw[blen[j]] + hashes[j]
            chars[k] += chars[j]
        blen[k] += blen[j]
        ids[k], ids[j] = merged, -1
        next_[k] = next_[j]
        if next_[j] >= 0:
            prev[next_[j]] = k
        for left in (prev[k], k):
            if left < 0 or next_[left] < 0:
                continue
            right = next_[left]
            rank, merged = _merge(spm, data, offsets, table, shift, pw, max_bytes, score_rank,
                                  first, merge_keys, merge_rank, merge_new, merge_shift, ids,
                                  blen, hashes, chars, left, right)
            if merged >= 0:
                size = _push(keys, pos, new, size, rank, left, merged)
    k = 0
    while k >= 0:
        out[o] = ids[k]
        o += 1
        k = next_[k]
    return o


@njit(cache=True)
def _scratch(n):
    """The symbol and heap arrays of a word of up to n symbols (at most 3 n heap entries)."""
    return (np.empty(n, np.int32), np.empty(n, np.int32), np.empty(n, np.int32),
            np.empty(n, np.int32), np.empty(n, np.uint64), np.empty(n, np.int32),
            np.empty(3 * n, np.int64), np.empty(3 * n, np.int32), np.empty(3 * n, np.int32))


# ----------------------------------------------------------------------------- texts
@njit(cache=True)
def _added_at(trie_root, trie_keys, trie_child, trie_token, trie_shift, text, p):
    """(end, token) of the longest added token starting at text[p], or (p, -1)."""
    node = trie_root[text[p]]
    end, token = p, np.int64(-1)
    q = p + 1
    mask = trie_keys.shape[0] - 1
    while node >= 0:
        if trie_token[node] >= 0:
            end, token = q, np.int64(trie_token[node])
        if q == text.shape[0]:
            break
        key = np.int64(node) * 256 + text[q]
        slot = np.int64((np.uint64(key) * _MIX) >> np.uint64(trie_shift))
        node = -1
        while trie_keys[slot] >= 0:
            if trie_keys[slot] == key:
                node = trie_child[slot]
                break
            slot = (slot + 1) & mask
        q += 1
    return end, token


@njit(cache=True)
def find_added(V, text, starts, ends, tokens):
    """The added tokens in the UTF-8 text, leftmost first, the longest at a position: match i
    is text[starts[i]:ends[i]], token tokens[i]; returns the number of matches."""
    root, keys, child, token_of, shift = \
        V.trie_root, V.trie_keys, V.trie_child, V.trie_token, V.trie_shift
    count = 0
    p = 0
    while p < text.shape[0]:
        if root[text[p]] >= 0:
            end, token = _added_at(root, keys, child, token_of, shift, text, p)
            if token >= 0:
                starts[count], ends[count], tokens[count] = p, end, token
                count += 1
                p = end
                continue
        p += 1
    return count


@njit(cache=True)
def encode_sentencepiece(V, text, prefix, unk, out):
    """The tokens of the UTF-8 text under a SentencePiece vocabulary, written to out (at least
    3 len(text) + 3 long); returns their number. Added tokens are cut out first
    (``find_added``); each piece between them has its spaces spelled ``▁`` (with ``prefix``, a
    piece at the start of the text that does not begin with ▁ gets one first: Metaspace's
    "first" scheme) and is one word (``_word``, byte fallback, ``unk`` for what has none)."""
    data, offsets, table, shift, byte_ids, pw = \
        V.data, V.offsets, V.table, V.shift, V.byte_ids, V.pw
    root, keys, child, token_of, trie_shift = \
        V.trie_root, V.trie_keys, V.trie_child, V.trie_token, V.trie_shift
    score_rank, first, max_bytes = V.score_rank, V.first, V.max_bytes
    no_keys, no_ranks = np.zeros(1, np.int64) - 1, np.zeros(1, np.int32)
    n = text.shape[0]
    norm = np.empty(0, np.uint8)
    scratch = _scratch(0)
    o = 0
    p = start = 0
    while True:
        end, token = p, np.int64(-1)
        if p < n and root[text[p]] >= 0:
            end, token = _added_at(root, keys, child, token_of, trie_shift, text, p)
        if token < 0 and p < n:
            p += 1
            continue
        if p > start:  # the piece text[start:p], at most 3 (p - start) + 3 bytes once spelled
            if norm.shape[0] < 3 * (p - start) + 3:
                norm = np.empty(3 * (p - start) + 3, np.uint8)
                scratch = _scratch(3 * (p - start) + 3)
            m = 0
            if prefix and start == 0 and text[0] != 0x20 and \
                    not (p >= 3 and _same(text, 0, _SPACE_MARK, 0, 3)):
                _mark(norm, 0)
                m = 3
            for k in range(start, p):
                if text[k] == 0x20:
                    _mark(norm, m)
                    m += 3
                else:
                    norm[m] = text[k]
                    m += 1
            o = _word(norm, 0, m, True, unk, data, offsets, table, shift, byte_ids, pw,
                      max_bytes, score_rank, first, no_keys, no_ranks, no_ranks, 0, scratch,
                      out, o)
        if p == n:
            return o
        out[o] = token
        o += 1
        p = start = end


@njit(cache=True)
def encode_words(V, words, slots, out):
    """The tokens of byte-level words under listed merges, written to out (at least len(words)
    + len(slots) long); returns their number. ``words`` holds one UTF-8 word per slot, the
    words separated by single spaces (a byte-level word holds none); slot i whose
    ``slots[i]`` >= 0 is that (added) token, its word empty."""
    data, offsets, table, shift, byte_ids, pw = \
        V.data, V.offsets, V.table, V.shift, V.byte_ids, V.pw
    merge_keys, merge_rank, merge_new, merge_shift = \
        V.merge_keys, V.merge_rank, V.merge_new, V.merge_shift
    longest, run = 0, 0
    for k in range(words.shape[0]):
        run = 0 if words[k] == 0x20 else run + 1
        longest = max(longest, run)
    scratch = _scratch(longest)
    o = 0
    p = 0
    for i in range(slots.shape[0]):
        e = p
        while e < words.shape[0] and words[e] != 0x20:
            e += 1
        if slots[i] >= 0:
            out[o] = slots[i]
            o += 1
        else:
            o = _word(words, p, e, False, -1, data, offsets, table, shift, byte_ids, pw, 0,
                      V.score_rank, V.first, merge_keys, merge_rank, merge_new, merge_shift,
                      scratch, out, o)
        p = e + 1
    return o


# ----------------------------------------------------------------------------- decoding
@njit(cache=True)
def _hex(c):
    if 0x30 <= c <= 0x39:
        return c - 0x30
    if 0x41 <= c <= 0x46:
        return c - 0x41 + 10
    if 0x61 <= c <= 0x66:
        return c - 0x61 + 10
    return -1


@njit(cache=True)
def _byte_token(data, s, n):
    """The byte a token spelled data[s:s+n] stands for as ``<0xNN>``, or -1."""
    if n != 6 or data[s] != 0x3C or data[s + 1] != 0x30 or data[s + 2] != 0x78 or \
            data[s + 5] != 0x3E:
        return -1
    hi, lo = _hex(data[s + 3]), _hex(data[s + 4])
    if data[s + 3] == 0x2B and lo >= 0:  # "+N": u8::from_str_radix takes a plus sign
        return lo
    if hi < 0 or lo < 0:
        return -1
    return hi * 16 + lo


@njit(cache=True)
def _end_run(out, start, o):
    """The byte run out[start:o]: kept when UTF-8, else one U+FFFD per byte; returns the end."""
    if utf8_valid(out, start, o):
        return o
    q = start
    for _ in range(o - start):
        out[q], out[q + 1], out[q + 2] = 0xEF, 0xBF, 0xBD
        q += 3
    return q


@njit(cache=True)
def decode_ids(V, ids, skip_special, byte_level, out):
    """The UTF-8 bytes of ``ids`` written to out (at least the spellings' total length);
    returns their number. Ids that are not live tokens are dropped, and SPECIAL ones with
    ``skip_special`` (module docstring for the rest)."""
    data, offsets = V.data, V.offsets
    o = 0
    run = -1  # where the current run of byte tokens starts in out
    for i in range(ids.shape[0]):
        t = ids[i]
        if t < 0 or t >= V.flags.shape[0] or not V.flags[t] & LIVE or \
                (skip_special and V.flags[t] & SPECIAL):
            continue
        s, n = offsets[t], offsets[t + 1] - offsets[t]
        if byte_level:
            start = o
            p = s
            while p < s + n:
                L = _utf8_length(data[p])
                c = _code_point(data, p, L)
                if c >= CHAR_BYTES.shape[0] or CHAR_BYTES[c] < 0:
                    for k in range(n):
                        out[start + k] = data[s + k]
                    o = start + n
                    break
                out[o] = CHAR_BYTES[c]
                o += 1
                p += L
            continue
        b = _byte_token(data, s, n)
        if b >= 0:
            if run < 0:
                run = o
            out[o] = b
            o += 1
            continue
        if run >= 0:
            o = _end_run(out, run, o)
            run = -1
        p = s
        while p < s + n:
            if p + 3 <= s + n and _same(data, p, _SPACE_MARK, 0, 3):
                out[o] = 0x20
                o += 1
                p += 3
            else:
                out[o] = data[p]
                o += 1
                p += 1
    if run >= 0:
        o = _end_run(out, run, o)
    return o
