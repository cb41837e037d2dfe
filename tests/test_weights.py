"""causallm.io (safetensors, nntr_bin): safetensors read/write, Checkpoint folders, NNTrainer .bin, bfloat16."""

import os

import numpy as np
import orjson
import pytest

from causallm.errors import CausalLMError
from causallm.io.nntr_bin import bin_nbytes, read_bin, write_bin
from causallm.io.safetensors import (
    Checkpoint,
    SafetensorsFile,
    bf16_to_f32,
    f32_to_bf16,
    write_safetensors,
)

SHAPES = [(), (0,), (1,), (7,), (3, 5), (2, 3, 4)]


def _rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


# ------------------------------------------------------------------------------------ bfloat16

def test_bf16_hand_built_values():
    cases = {  # float32 bit pattern -> bfloat16 bit pattern (all exactly representable)
        0x3F800000: 0x3F80,  # 1.0
        0x40490000: 0x4049,  # 3.140625
        0xC0000000: 0xC000,  # -2.0
        0x00010000: 0x0001,  # smallest bf16 subnormal, 2**-133
        0x80000000: 0x8000,  # -0.0
        0x7F800000: 0x7F80,  # inf
        0xFF800000: 0xFF80,  # -inf
        0x7FC00000: 0x7FC0,  # nan
    }
    f32 = np.array(list(cases), dtype=np.uint32).view(np.float32)
    u16 = np.array(list(cases.values()), dtype=np.uint16)
    assert f32[0] == 1.0 and f32[1] == 3.140625 and f32[2] == -2.0 and f32[3] == 2.0 ** -133
    np.testing.assert_array_equal(f32_to_bf16(f32), u16)
    np.testing.assert_array_equal(_bits(bf16_to_f32(u16)), list(cases))  # widening is exact
    assert bf16_to_f32(u16).dtype == np.float32


def test_f32_to_bf16_rounding():
    one = 0x3F800000
    cases = {
        one + 0x8000: 0x3F80,  # exactly halfway, even below -> down
        one + 0x18000: 0x3F82,  # halfway, odd below -> up to even
        one + 0x8001: 0x3F81,  # just above halfway -> up
        one + 0x7FFF: 0x3F80,  # just below halfway -> down
        0x7F7FFFFF: 0x7F80,  # float32 max rounds to inf
        0x7F800001: 0x7FC0,  # signalling nan with low payload stays nan, never inf
        0xFFC00000: 0xFFC0,  # negative nan keeps its sign
        0x00000001: 0x0000,  # smallest float32 subnormal rounds to 0
    }
    f32 = np.array(list(cases), dtype=np.uint32).view(np.float32)
    np.testing.assert_array_equal(f32_to_bf16(f32), list(cases.values()))


def test_f32_to_bf16_is_nearest():
    x = np.random.default_rng(1).standard_normal(10000).astype(np.float32) * 1e3
    got = bf16_to_f32(f32_to_bf16(x)).astype(np.float64)
    down = (_bits(x) & 0xFFFF0000).view(np.float32).astype(np.float64)
    up = ((_bits(x) & 0xFFFF0000) + 0x10000).view(np.float32).astype(np.float64)
    best = np.minimum(np.abs(x - down), np.abs(x - up))
    np.testing.assert_array_equal(np.abs(x - got), best)
    assert f32_to_bf16(x.reshape(100, 100)).shape == (100, 100)


# ------------------------------------------------------------------------------------ safetensors

@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_safetensors_round_trip(tmp_path, dtype):
    tensors = {f"t{i}": _rand(s, i) for i, s in enumerate(SHAPES)}
    path = tmp_path / "m.safetensors"
    write_safetensors(path, tensors, metadata={"format": "np"}, dtype=dtype)
    f = SafetensorsFile(path)
    assert sorted(f.keys()) == sorted(tensors) and len(f) == len(tensors)
    assert f.metadata == {"format": "np"}
    for name, want in tensors.items():
        assert f.dtype(name) == dtype and f.shape(name) == want.shape
        got = f.get(name)
        assert got.dtype == np.float32 and got.shape == want.shape
        assert got.flags.c_contiguous and not got.flags.writeable
        if dtype == "F32":
            np.testing.assert_array_equal(got, want)
            assert got.size == 0 or not got.flags.owndata  # a view of the map
        elif dtype == "F16":
            np.testing.assert_array_equal(got, want.astype(np.float16).astype(np.float32))
        else:
            np.testing.assert_array_equal(got, bf16_to_f32(f32_to_bf16(want)))
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_safetensors_layout(tmp_path):
    """Header padded to 8; no gaps; widest dtype first so every tensor is aligned."""
    tensors = {"h": np.ones(3, np.float16), "f": np.ones(3, np.float32),
               "i": np.arange(5, dtype=np.int64), "b": np.array([True, False])}
    path = tmp_path / "x.safetensors"
    write_safetensors(path, tensors)
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0
    header = orjson.loads(raw[8:8 + n])
    spans = sorted(v["data_offsets"] for v in header.values())
    assert spans[0][0] == 0 and spans[-1][1] == len(raw) - 8 - n
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    for v in header.values():
        assert v["data_offsets"][0] % {"F32": 4, "F16": 2, "I64": 8, "BOOL": 1}[v["dtype"]] == 0
    f = SafetensorsFile(path)
    assert [f.dtype(k) for k in "hfib"] == ["F16", "F32", "I64", "BOOL"]
    np.testing.assert_array_equal(f.get("i"), np.arange(5))  # integers stay exact
    assert f.get("i").dtype == np.int64 and f.metadata == {}


def test_safetensors_f64_and_overwrite(tmp_path):
    path = tmp_path / "x.safetensors"
    write_safetensors(path, {"a": np.zeros(2)})
    x = np.array([1 / 3, 1e-50, -1e30])
    write_safetensors(path, {"a": x})  # float64 is written as F32, replacing the old file
    assert SafetensorsFile(path).dtype("a") == "F32"
    np.testing.assert_array_equal(SafetensorsFile(path).get("a"), x.astype(np.float32))


def _raw_safetensors(path, header, data=b"", n=None):
    blob = orjson.dumps(header) if isinstance(header, dict) else header
    n = len(blob) if n is None else n
    path.write_bytes(n.to_bytes(8, "little") + blob + data)
    return path


def test_safetensors_f64_read_and_unaligned(tmp_path):
    # F64 narrowed to float32; an F32 tensor at an odd offset is copied, not misread
    x = np.array([1 / 3, -2.5])
    y = np.array([1.5, 2.5], np.float32)
    hdr = {"x": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]},
           "y": {"dtype": "F32", "shape": [2], "data_offsets": [17, 25]}}
    p = _raw_safetensors(tmp_path / "a.safetensors", hdr, x.tobytes() + b"\0" + y.tobytes())
    f = SafetensorsFile(p)
    np.testing.assert_array_equal(f.get("x"), x.astype(np.float32))
    np.testing.assert_array_equal(f.get("y"), y)
    assert not f.get("y").flags.writeable


@pytest.mark.parametrize("header, data, n, message", [
    (b"{}", b"", 10 ** 9, "header length 1000000000"),
    (b"{}", b"", 1, "header length 1"),
    (b"{not json", b"", None, "not valid JSON"),
    (b"[]", b"", None, "not a JSON object"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"1234", None,
     "data_offsets [0, 8] outside the 4-byte data buffer"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8), None,
     "shape [3] x F32 is 12 bytes but data_offsets [0, 8] span 8"),
    ({"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}, bytes(1), None,
     "tensor 'a': unknown dtype 'Q9'"),
    ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, b"", None, "bad shape"),
    ({"a": {"dtype": "F32", "shape": [1]}}, bytes(4), None, "needs dtype, shape and data_offsets"),
])
def test_safetensors_corrupt(tmp_path, header, data, n, message):
    p = _raw_safetensors(tmp_path / "bad.safetensors", header, data, n)
    with pytest.raises(CausalLMError) as e:
        SafetensorsFile(p)
    assert str(e.value).startswith(str(p)) and message in str(e.value)
    assert "\n" not in str(e.value)


def test_safetensors_short_file_and_unsupported_dtype(tmp_path):
    p = tmp_path / "tiny.safetensors"
    p.write_bytes(b"\x02\0\0")
    with pytest.raises(CausalLMError, match="not a safetensors file"):
        SafetensorsFile(p)
    hdr = {"q": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}
    f = SafetensorsFile(_raw_safetensors(p, hdr, bytes(4)))
    assert f.shape("q") == (4,) and f.dtype("q") == "F8_E4M3"
    with pytest.raises(CausalLMError, match=r"tiny.safetensors: tensor 'q' has dtype F8_E4M3"):
        f.get("q")
    with pytest.raises(CausalLMError, match="no tensor named 'nope'"):
        f.get("nope")


# ------------------------------------------------------------------------------------ Checkpoint

def _sharded(folder, weight_map=None):
    a, b = {"w.a": _rand((2, 3), 1), "w.b": _rand((4,), 2)}, {"w.c": _rand((3,), 3)}
    write_safetensors(folder / "model-00001-of-00002.safetensors", a)
    write_safetensors(folder / "model-00002-of-00002.safetensors", b, dtype="BF16")
    if weight_map is None:
        weight_map = {"w.a": "model-00001-of-00002.safetensors",
                      "w.c": "model-00002-of-00002.safetensors",
                      "w.b": "model-00001-of-00002.safetensors"}
    (folder / "model.safetensors.index.json").write_bytes(
        orjson.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return {**a, **b}


def test_checkpoint_sharded(tmp_path):
    want = _sharded(tmp_path)
    ck = Checkpoint(tmp_path)
    assert ck.keys() == ["w.a", "w.c", "w.b"] and len(ck) == 3 and "w.c" in ck
    assert ck.file_of("w.c") == str(tmp_path / "model-00002-of-00002.safetensors")
    assert ck.dtype("w.c") == "BF16" and ck.shape("w.a") == (2, 3)
    np.testing.assert_array_equal(ck.get("w.a"), want["w.a"])
    np.testing.assert_array_equal(ck.get("w.c"), bf16_to_f32(f32_to_bf16(want["w.c"])))
    with pytest.raises(CausalLMError, match="checkpoint has no tensor named 'w.z'"):
        ck.get("w.z")


def test_checkpoint_index_errors(tmp_path):
    _sharded(tmp_path, {"w.a": "model-00003-of-00002.safetensors"})
    with pytest.raises(CausalLMError, match=r"index.json: shard 'model-00003-of-00002.safetensors'"
                       r" \(for 'w.a'\) does not exist"):
        Checkpoint(tmp_path)
    _sharded(tmp_path, {"w.c": "model-00001-of-00002.safetensors"})
    with pytest.raises(CausalLMError, match="'w.c' is mapped to 'model-00001-of-00002.safetensors',"
                       " which has no such tensor"):
        Checkpoint(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_bytes(b'{"metadata": {}}')
    with pytest.raises(CausalLMError, match="not a safetensors index"):
        Checkpoint(tmp_path)


def test_a_shard_outside_the_folder_is_refused(tmp_path):
    """A weight_map entry naming a file outside the model folder (through .., or absolute) is
    an error naming the index and the entry, even when that file exists and holds the tensor;
    a name that only starts with dots is a file of the folder."""
    folder = tmp_path / "model"
    folder.mkdir()
    write_safetensors(tmp_path / "x.safetensors", {"w.a": _rand((2, 3), 1)})
    index = folder / "model.safetensors.index.json"
    for file in ("../x.safetensors", str(tmp_path / "x.safetensors"), "sub/../../x.safetensors",
                 7, ""):
        _sharded(folder, {"w.a": file})
        with pytest.raises(CausalLMError) as e:
            Checkpoint(folder)
        assert str(e.value) == (f"{index}: \"weight_map\" entry 'w.a': {file!r} is not a file "
                                f"name inside the model folder")
    write_safetensors(folder / "..x.safetensors", {"w.a": _rand((2, 3), 1)})
    _sharded(folder, {"w.a": "..x.safetensors"})
    assert Checkpoint(folder).file_of("w.a") == str(folder / "..x.safetensors")


def test_a_weight_file_that_cannot_be_opened_is_named(tmp_path):
    """A weight file the OS will not open (a folder, a symbolic link that loops: what root,
    who runs the tests, cannot be kept from reading) is a one-line error naming it, not an
    OSError."""
    with pytest.raises(CausalLMError) as e:
        SafetensorsFile(tmp_path)
    assert str(e.value) == f"{tmp_path}: cannot read (Is a directory)"
    folder = tmp_path / "model"
    folder.mkdir()
    os.symlink("model.safetensors", folder / "model.safetensors")
    with pytest.raises(CausalLMError) as e:
        Checkpoint(folder)
    assert str(e.value) == (f"{folder / 'model.safetensors'}: cannot read (Too many levels of "
                            f"symbolic links)")
    with pytest.raises(CausalLMError) as e:
        read_bin(folder, [("w", (2,), "FP32")])
    assert str(e.value) == f"{folder}: a folder, not a .bin weight file"


def test_checkpoint_single_and_fallback(tmp_path):
    with pytest.raises(CausalLMError) as e:
        Checkpoint(tmp_path)
    assert str(e.value) == f"{tmp_path}: no model.safetensors or model.safetensors.index.json"
    write_safetensors(tmp_path / "weights.safetensors", {"x": np.ones(2, np.float32)})
    ck = Checkpoint(tmp_path)
    assert ck.keys() == ["x"] and ck.file_of("x").endswith("weights.safetensors")
    write_safetensors(tmp_path / "other.safetensors", {"y": np.ones(2, np.float32)})
    with pytest.raises(CausalLMError, match="to choose between other.safetensors, weights"):
        Checkpoint(tmp_path)
    write_safetensors(tmp_path / "model.safetensors", {"z": np.ones(2, np.float32)})
    assert Checkpoint(tmp_path).keys() == ["z"]
    with pytest.raises(CausalLMError, match="not a directory"):
        Checkpoint(tmp_path / "model.safetensors")


# ------------------------------------------------------------------------------------ .bin

def test_bin_nbytes():
    assert bin_nbytes((3, 4), "FP32") == 48 and bin_nbytes((3, 4), "FP16") == 24
    assert bin_nbytes((), "FP32") == 4
    assert bin_nbytes((64, 32), "Q4_0") == 64 * 18
    assert bin_nbytes((256, 512), "Q6_K") == 512 * 210
    assert bin_nbytes((64, 32), "Q8_0") == 64 * 34
    with pytest.raises(CausalLMError, match="'BF16' is not one of FP32, FP16, Q4_0, Q8_0, Q6_K"):
        bin_nbytes((2,), "BF16")


def test_bin_round_trip_unaligned(tmp_path):
    # FP16 of odd length pushes the following FP32 weights off 4-byte alignment
    arrays = [_rand((3,), 1), _rand((2, 3), 2), _rand((5,), 3), _rand((), 4), _rand((2, 2), 5)]
    dtypes = ["FP16", "FP32", "FP16", "FP32", "FP32"]
    specs = [(f"w{i}", a.shape, d) for i, (a, d) in enumerate(zip(arrays, dtypes))]
    path = tmp_path / "m.bin"
    write_bin(path, arrays, dtypes)
    assert path.stat().st_size == sum(bin_nbytes(a.shape, d) for a, d in zip(arrays, dtypes))
    assert path.read_bytes()[:6] == arrays[0].astype("<f2").tobytes()  # raw, no header
    got = read_bin(path, specs)
    for a, d, g in zip(arrays, dtypes, got):
        want = a.astype(np.float16).astype(np.float32) if d == "FP16" else a
        assert g.dtype == np.float32 and g.shape == a.shape and g.flags.c_contiguous
        assert not g.flags.writeable
        np.testing.assert_array_equal(g, want)
    assert not got[4].flags.owndata  # offset 6+24+10+4 = 44: aligned, so a view


def test_bin_short_and_long(tmp_path):
    arrays = [_rand((4, 8), 1), _rand((8,), 2), _rand((8, 4), 3)]
    specs = [("layer0_wq:weight", (4, 8), "FP32"), ("layer0_norm:gamma", (8,), "FP16"),
             ("output_of_causallm:weight", (8, 4), "FP32")]
    path = tmp_path / "m.bin"
    write_bin(path, arrays, [s[2] for s in specs])  # 128 + 16 + 128 = 272 bytes
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CausalLMError) as e:
        read_bin(path, specs)
    assert str(e.value) == (
        f"{path}: expected 272 bytes for the model's 3 weights, found 200 (72 bytes short; the "
        "first weight that does not fit is 'output_of_causallm:weight' (8, 4) FP32, 128 bytes at "
        "offset 144)")
    path.write_bytes(bytes(272 + 12))
    with pytest.raises(CausalLMError) as e:
        read_bin(path, specs)
    assert str(e.value) == (f"{path}: expected 272 bytes for the model's 3 weights, found 284 "
                            "(12 bytes too many)")
    assert [a.shape for a in read_bin(path, specs, allow_extra=True)] == [(4, 8), (8,), (8, 4)]


def test_bin_dtype_errors(tmp_path):
    path = tmp_path / "q.bin"
    path.write_bytes(bytes(18 * 2))
    with pytest.raises(CausalLMError, match=r"weight 'fc' \(32, 2\) cannot be Q4_0: .* a "
                                            r"multiple of 8 outputs$"):
        read_bin(path, [("fc", (32, 2), "Q4_0")])  # the size check passes first; N % 8 != 0
    with pytest.raises(CausalLMError, match="expected 210 bytes .* found 36"):
        read_bin(path, [("emb", (256,), "Q6_K")])
    with pytest.raises(CausalLMError, match="weight 'x' has dtype 'INT8', not one of"):
        read_bin(path, [("x", (2,), "INT8")])
    with pytest.raises(CausalLMError, match=r"weight #0: dtype 'Q2_K' is not supported"):
        write_bin(path, [np.zeros((8, 256))], ["Q2_K"])
    with pytest.raises(CausalLMError, match=r"weight 'emb:Embedding' \(2, 256\) cannot be Q4_K: "
                                            r"NNTrainer has no Q4_K table"):
        write_bin(path, [np.zeros((2, 256))], ["Q4_K"], ["emb:Embedding"])
    with pytest.raises(CausalLMError, match=r"weight 'fc:weight' \(20, 3\) cannot be Q8_0: it "
                                            r"needs rows of a multiple of 32 values along its"):
        write_bin(path, [np.zeros((20, 3))], ["Q8_0"], ["fc:weight"])
    with pytest.raises(CausalLMError, match=r"weight #1 \(2,\): values beyond the FP16 range"):
        write_bin(path, [np.zeros(1), np.array([1.0, 7e4])], ["FP16", "FP16"])
    with pytest.raises(CausalLMError, match="2 arrays but 1 dtypes"):
        write_bin(path, [np.zeros(1), np.zeros(1)], ["FP32"])
    assert path.read_bytes() == bytes(36)  # failed writes left the old file alone


# ------------------------------------------------------------------------------------ vs safetensors

def test_agrees_with_safetensors_package(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    tensors = {"a": _rand((3, 4), 1), "b": _rand((5,), 2).astype(np.float16),
               "c": np.array(2.5, np.float32), "d": np.arange(6, dtype=np.int32)}
    theirs = tmp_path / "theirs.safetensors"
    st.save_file(tensors, str(theirs), metadata={"k": "v"})
    f = SafetensorsFile(theirs)
    assert f.metadata == {"k": "v"}
    for name, want in st.load_file(str(theirs)).items():
        np.testing.assert_array_equal(f.get(name), want)
        assert f.get(name).dtype == (np.int32 if name == "d" else np.float32)
    ours = tmp_path / "ours.safetensors"
    write_safetensors(ours, tensors, metadata={"k": "v"})
    back = st.load_file(str(ours))
    assert sorted(back) == sorted(tensors)
    for name, want in tensors.items():
        assert back[name].dtype == want.dtype
        np.testing.assert_array_equal(back[name], want)


def _resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_release_pages_gives_back_a_read_mapping_and_keeps_its_values(tmp_path):
    """A converted weight's source pages leave the process (RSS drops by the mapping) and read
    back the same; memory that is not a read-only file mapping is not touched."""
    from causallm.io.files import release_pages

    values = np.arange(16 << 20, dtype=np.float32)            # 64 MiB
    path = tmp_path / "w.bin"
    values.tofile(path)
    mapped = np.memmap(path, dtype=np.float32, mode="r")
    view = mapped[1000:].reshape(-1, 4).T                       # a strided view of it
    assert float(view.sum(dtype=np.float64)) > 0                # every page read in
    before = _resident_mb()
    release_pages(view)
    assert before - _resident_mb() > 48, (before, _resident_mb())
    np.testing.assert_array_equal(mapped, values)
    anonymous = values.copy()
    release_pages(anonymous, np.zeros(0, np.float32))
    np.testing.assert_array_equal(anonymous, values)
