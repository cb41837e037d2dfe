"""Qwen3MoeForCausalLM (and its Slim / CachedSlim twins) against Hugging Face transformers.

- the MoE kernels against plain numpy twins written here (odd sizes, both weight layouts, the
  numba path for a few tokens and the BLAS path for many);
- the ``qwen_moe`` layer against its formula (softmax router, top-k, optional renormalisation);
- parity on the committed fixtures made by tools/fixtures_qwen3_moe.py: per-expert (Hub)
  BF16 weights with a dense layer from ``mlp_only_layers`` and ``norm_topk_prob`` true, and
  transformers 5's fused F32 experts with ``decoder_sparse_step`` 2, ``norm_topk_prob`` false
  and a sliding window on every layer: prefill logits, >= 24 teacher-forced cached decode
  steps, greedy tokens and a one-shot forward, with every expert resident and with the expert
  cache (which must give the very same logits);
- the .bin path (FP32 and FP16) with the cache, ``save_weight`` from a cached model, and
  the memory promise: peak RSS (``ru_maxrss`` of a subprocess) with the cache is far below
  all-resident on a model whose experts dominate, with identical logits;
- the CLI once. Nothing here imports torch or transformers.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import parity
import pytest
from graphs import build, feature_input
from parity import FIXTURES, ROOT, expected, teacher_forced

from causallm.api import createLayer, createModel, withKey
from causallm.errors import CausalLMError
from causallm.io.config import load_model_configs
from causallm.io.safetensors import write_safetensors
from causallm.kernels.linear import BLAS_MIN_ROWS
from causallm.kernels.moe import expert_ffn, expert_ffn_io, expert_ffn_oi, moe_group, moe_topk
from causallm.runtime.registry import registerFactory
from causallm.layers.qwen_moe import CachedSlimMoELayer, MoELayer, SlimMoELayer
from causallm.models.qwen3_cached_slim_moe.qwen3_cached_slim_moe_causallm import Qwen3CachedSlimMoECausalLM
from causallm.models.qwen3_moe.qwen3_moe_causallm import Qwen3MoECausalLM
from causallm.models.qwen3_slim_moe.qwen3_slim_moe_causallm import Qwen3SlimMoECausalLM

for _cls in (MoELayer, SlimMoELayer, CachedSlimMoELayer):
    registerFactory(_cls)

F32 = np.float32
MOE_FIXTURES = ["qwen3moe-e8k2-dense", "qwen3moe-e8k3-fused"]
# (class, nntr_config overrides): all resident; slim (k experts kept); cached slim with 3
VARIANTS = {"resident": (Qwen3MoECausalLM, {}),
            "slim": (Qwen3SlimMoECausalLM, {}),
            "cached3": (Qwen3CachedSlimMoECausalLM, {"moe_expert_cache": 3})}


# ------------------------------------------------------------------------------ numpy twins
def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def moe_topk_ref(logits, k, normalize):
    """(idx, weight) of the k largest softmax probabilities per row, descending."""
    p = softmax(logits.astype(np.float64))
    idx = np.argsort(-p, axis=-1, kind="stable")[..., :k]
    w = np.take_along_axis(p, idx, axis=-1)
    return idx, (w / w.sum(axis=-1, keepdims=True) if normalize else w)


def moe_group_ref(idx, weight, nrows, num_experts):
    """CSR lists per expert: starts, flat rows (b * nrows + t, ascending), scales, hit experts."""
    B, _, k = idx.shape
    starts, rows, scales = [0], [], []
    for e in range(num_experts):
        for b in range(B):
            for t in range(nrows):
                for j in range(k):
                    if idx[b, t, j] == e:
                        rows.append(b * nrows + t)
                        scales.append(weight[b, t, j])
        starts.append(len(rows))
    hit = [e for e in range(num_experts) if starts[e + 1] > starts[e]]
    return np.array(starts), np.array(rows), np.array(scales), hit


def expert_ffn_ref(x, rows, scales, nrows, gate, up, down, y):
    """y[b, t] += s * (silu(x @ gate) * (x @ up)) @ down, in float64."""
    y = y.astype(np.float64)
    for r, s in zip(rows, scales):
        b, t = divmod(int(r), nrows)
        xr = x[b, t].astype(np.float64)
        g = xr @ gate
        y[b, t] += s * ((g / (1 + np.exp(-g)) * (xr @ up)) @ down)
    return y


def moe_ref(x, router, experts, k, normalize):
    """The qwen_moe formula for rows x (n, H): experts[e] = (up, gate, down) [in, out]."""
    idx, w = moe_topk_ref(x.astype(np.float64) @ router, k, normalize)
    y = np.zeros(x.shape, dtype=np.float64)
    for i, xr in enumerate(x.astype(np.float64)):
        for e, we in zip(idx[i], w[i]):
            up, gate, down = (a.astype(np.float64) for a in experts[e])
            g = xr @ gate
            y[i] += we * ((g / (1 + np.exp(-g)) * (xr @ up)) @ down)
    return y


# ------------------------------------------------------------------------------ kernels
@pytest.mark.parametrize("normalize", [True, False])
def test_moe_topk_and_group_match_numpy(normalize):
    rng = np.random.default_rng(0)
    B, T, E, k, nrows = 2, 9, 7, 3, 6
    logits = rng.standard_normal((B, T, E)).astype(F32)
    orig = logits.copy()
    want_idx, want_w = moe_topk_ref(orig[:, :nrows], k, normalize)
    idx = np.zeros((B, T, k), np.int64)
    w = np.zeros((B, T, k), F32)
    moe_topk(logits, nrows, normalize, idx, w)
    assert np.array_equal(idx[:, :nrows], want_idx)
    np.testing.assert_allclose(w[:, :nrows], want_w, rtol=1e-6)
    np.testing.assert_allclose(logits[:, :nrows], softmax(orig[:, :nrows].astype(np.float64)),
                               rtol=1e-6)  # the router probabilities replace the logits
    assert np.array_equal(logits[:, nrows:], orig[:, nrows:])
    starts, rows, scales, hit = (np.zeros(E + 1, np.int64), np.zeros(B * T * k, np.int64),
                                 np.zeros(B * T * k, F32), np.zeros(E, np.int64))
    n_hit = moe_group(idx, w, nrows, starts, rows, scales, hit)
    s_ref, r_ref, sc_ref, hit_ref = moe_group_ref(idx, w, nrows, E)
    assert np.array_equal(starts, s_ref) and list(hit[:n_hit]) == hit_ref
    assert np.array_equal(rows[:starts[-1]], r_ref)
    assert np.array_equal(scales[:starts[-1]], sc_ref.astype(F32))


def test_moe_topk_breaks_ties_to_the_lower_index():
    logits = np.zeros((1, 1, 5), F32)
    logits[0, 0, 3] = 1.0
    idx, w = np.zeros((1, 1, 3), np.int64), np.zeros((1, 1, 3), F32)
    moe_topk(logits, 1, True, idx, w)
    assert idx[0, 0].tolist() == [3, 0, 1]


@pytest.mark.parametrize("n", [1, 3, 11])             # decode, numba below BLAS_MIN_ROWS, BLAS
@pytest.mark.parametrize("layout", ["io", "oi"])
def test_expert_ffn_matches_numpy(n, layout):
    rng = np.random.default_rng(n)
    B, T, H, I, nrows = 2, 8, 37, 53, 7
    x = rng.standard_normal((B, T, H)).astype(F32)
    gate, up = (rng.standard_normal((H, I)).astype(F32) * 0.3 for _ in range(2))
    down = rng.standard_normal((I, H)).astype(F32) * 0.3
    rows = np.sort(rng.choice(B * nrows, size=n, replace=False)).astype(np.int64)
    scales = rng.random(n).astype(F32)
    y0 = rng.standard_normal((B, T, H)).astype(F32)
    want = expert_ffn_ref(x, rows, scales, nrows, gate, up, down, y0)
    h, u = np.zeros((B * T, I), F32), np.zeros((B * T, I), F32)
    if layout == "oi":  # the transpose views of PyTorch [out, in] arrays
        gate, up, down = (np.ascontiguousarray(a.T).T for a in (gate, up, down))
    y = y0.copy()
    expert_ffn(x, rows, scales, nrows, gate, up, down, h, u, y)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    if n < BLAS_MIN_ROWS:  # the kernel of the layout, called directly
        y = y0.copy()
        if layout == "io":
            expert_ffn_io(x, rows, scales, nrows, gate, up, down, h, u, y)
        else:
            expert_ffn_oi(x, rows, scales, nrows, gate.T, up.T, down.T, h, y)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ layer
def moe_graph(H, E, k, I, rows, batch, layer_type="qwen_moe", **props):
    return build([feature_input("x", rows, H), createLayer(layer_type, [
        withKey("name", "moe"), withKey("input_layers", "x"), withKey("unit", I),
        withKey("num_experts", E), withKey("num_experts_per_token", k),
        withKey("moe_activation", "swish"), *[withKey(a, b) for a, b in props.items()]])], batch)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("layout", ["io", "oi"])
def test_qwen_moe_layer_matches_formula(norm, layout):
    rng = np.random.default_rng(7)
    B, H, E, k, I, L = 2, 20, 6, 2, 12, 10
    model = moe_graph(H, E, k, I, L, B, norm_topk_prob=norm)
    names = [s.full_name for s in model.getWeightSpecs()]
    assert names[:4] == ["moe:gate", "moe:expert_up_0", "moe:expert_gate_0", "moe:expert_down_0"]
    assert len(names) == 1 + 3 * E and model.getWeightSpecs()[0].dtype == "FP32"
    router = rng.standard_normal((H, E)).astype(F32)
    experts = [tuple(rng.standard_normal(s).astype(F32) * 0.3 for s in ((H, I), (H, I), (I, H)))
               for _ in range(E)]
    model.setWeight("moe:gate", router)
    for e, arrays in enumerate(experts):
        for w, a in zip(("up", "gate", "down"), arrays):
            model.setWeight(f"moe:expert_{w}_{e}", a if layout == "io" else np.ascontiguousarray(a.T).T)
    x = rng.standard_normal((B, 9, H)).astype(F32)
    for from_, to in ((0, 6), (6, 7), (7, 9)):  # prefill (BLAS), decode, 2 rows (numba)
        out = model.incremental_inference(B, [x[:, from_:to].reshape(B, -1)], None, None, from_, to)
        got = out[0].reshape(B, L, H)[:, :to - from_]
        want = moe_ref(x[:, from_:to].reshape(-1, H), router, experts, k, norm)
        np.testing.assert_allclose(got.reshape(-1, H), want, rtol=1e-5, atol=1e-5)


def test_qwen_moe_layer_cache_defaults():
    caps = {t: None for t in ("qwen_moe", "moe_slim", "moe_cached_slim")}
    for t in caps:
        layers = []
        moe_graph(4, 40, 3, 4, 1, 1, t).forEachLayer(lambda layer, ctx, acc: acc.append(layer), layers)
        caps[t] = layers[1].cache_capacity
    assert caps == {"qwen_moe": 0, "moe_slim": 3, "moe_cached_slim": 32}
    layers = []
    moe_graph(4, 5, 3, 4, 1, 1, "moe_cached_slim").forEachLayer(lambda l, c, a: a.append(l), layers)
    assert layers[1].cache_capacity == 5  # capped at num_experts


@pytest.mark.parametrize("k, activation, needle", [
    (2, "gelu", "moe_activation"),                 # only swish (silu) experts exist
    (7, "swish", "num_experts_per_token"),          # more experts per token than experts
])
def test_qwen_moe_layer_bad_properties_are_one_line_errors(k, activation, needle):
    with pytest.raises(CausalLMError) as e:
        model = createModel()
        model.addLayer(createLayer("input", [withKey("name", "x"), withKey("input_shape", "1:1:4")]))
        model.addLayer(createLayer("qwen_moe", [
            withKey("name", "moe"), withKey("input_layers", "x"), withKey("unit", 4),
            withKey("num_experts", 6), withKey("num_experts_per_token", k),
            withKey("moe_activation", activation)]))
        model.compile()
    message = str(e.value)
    assert "\n" not in message and needle in message and "moe" in message, message


# ------------------------------------------------------------------------------ parity
def load(name, variant="resident", weights=None, **nntr):
    cls, extra = VARIANTS[variant]
    return parity.load(cls, name, weights=weights, **{**extra, **nntr})


def moe_caches(model):
    return [layer.expert_cache for _, layer in model.moeLayers()]


@pytest.mark.slow
@pytest.mark.parametrize("name", MOE_FIXTURES)
def test_prefill_and_cached_decode_match_transformers(name):
    ref = expected(name)
    assert len(ref["tokens"]) >= 25
    resident = parity.check_prefill_and_cached_decode(load(name), ref)
    for variant in ("slim", "cached3"):  # experts read from the file into the LRU
        model = load(name, variant)
        assert np.array_equal(teacher_forced(model, ref), resident), variant
        capacity = 3 if variant == "cached3" else model.NUM_EXPERTS_PER_TOK
        for cache in moe_caches(model):
            assert cache is not None and 0 < len(cache) <= capacity and cache.misses > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", MOE_FIXTURES)
def test_greedy_generation_gives_transformers_tokens(name):
    ref = expected(name)
    for variant in ("resident", "cached3"):
        parity.check_greedy(load(name, variant), ref, variant)


@pytest.mark.parametrize("name", MOE_FIXTURES)
def test_one_shot_forward_matches_no_cache_reference(name):
    ref = expected(name)
    model = load(name, init_seq_len=len(parity.full_sequence(ref)), num_to_generate=8)
    parity.check_one_shot(model, ref)


@pytest.mark.slow
def test_graph_follows_mlp_only_layers_and_decoder_sparse_step():
    def types(model):
        return {n: t for n, t in ((ctx.getName(), layer.type) for layer, ctx in model.model._run)
                if n.endswith("_ffn_down")}
    dense = load("qwen3moe-e8k2-dense")
    assert types(dense) == {"layer0_ffn_down": "qwen_moe", "layer1_ffn_down": "fully_connected",
                            "layer2_ffn_down": "qwen_moe"}
    assert dense.NORM_TOPK_PROB is True and dense.NUM_EXPERTS == 8  # Hub key num_experts
    fused = load("qwen3moe-e8k3-fused", "slim")
    assert types(fused) == {"layer0_ffn_down": "fully_connected", "layer1_ffn_down": "moe_slim",
                            "layer2_ffn_down": "fully_connected", "layer3_ffn_down": "moe_slim"}
    assert fused.NORM_TOPK_PROB is False and fused.NUM_EXPERTS == 8  # num_local_experts
    assert fused.hf_fused_experts
    specs = [(s.full_name, s.shape) for s in fused.model.getWeightSpecs()
             if s.full_name.startswith("layer1_ffn_down:")]
    assert specs[:4] == [("layer1_ffn_down:gate", (24, 8)), ("layer1_ffn_down:expert_up_0", (24, 40)),
                         ("layer1_ffn_down:expert_gate_0", (24, 40)),
                         ("layer1_ffn_down:expert_down_0", (40, 24))]


def test_missing_moe_keys_is_one_line_error(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(os.path.join(FIXTURES, "qwen3moe-e8k2-dense"), folder)
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["num_experts"]
    (folder / "config.json").write_text(json.dumps(cfg))
    cfg, gen, nntr = load_model_configs(str(folder))
    with pytest.raises(CausalLMError) as e:
        Qwen3MoECausalLM(cfg, gen, nntr)
    assert "\n" not in str(e.value) and "num_experts" in str(e.value) and "config.json" in str(e.value)


# ------------------------------------------------------------------------------ .bin
@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["FP32", "FP16"])
def test_bin_with_expert_cache_gives_resident_logits(tmp_path, dtype):
    name = "qwen3moe-e8k3-fused"
    ref = expected(name)
    tensor_type = f"{dtype}-FP32"
    src = load(name, model_tensor_type=tensor_type)
    bin_path = str(tmp_path / "model.bin")
    src.save_weight(bin_path)
    resident = teacher_forced(load(name, weights=bin_path, model_tensor_type=tensor_type), ref)
    cached = load(name, "cached3", weights=bin_path, model_tensor_type=tensor_type)
    assert np.array_equal(teacher_forced(cached, ref), resident)
    rel = 2e-4 if dtype == "FP32" else 2e-3  # FP16 rounds every projection weight
    scale = max(1.0, float(np.abs(ref["step_logits"]).max()))
    assert float(np.abs(resident - ref["step_logits"]).max()) <= rel * scale
    assert np.argmax(resident, axis=1).tolist() == ref["tokens"].tolist()
    # a cached model writes the same .bin, its experts copied from the file
    again = str(tmp_path / "again.bin")
    cached.save_weight(again)
    with open(bin_path, "rb") as a, open(again, "rb") as b:
        assert a.read() == b.read()


@pytest.mark.slow
def test_save_weight_from_cached_hf_model_equals_resident(tmp_path):
    name = "qwen3moe-e8k2-dense"
    a, b = str(tmp_path / "a.bin"), str(tmp_path / "b.bin")
    load(name).save_weight(a)
    load(name, "cached3").save_weight(b)
    with open(a, "rb") as fa, open(b, "rb") as fb:
        assert fa.read() == fb.read()


# ------------------------------------------------------------------------------ memory
RSS_SCRIPT = r"""
import sys
import numpy as np
from causallm.io.config import load_model_configs
from causallm.models.qwen3_moe.qwen3_moe_causallm import Qwen3MoECausalLM
folder, cache, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cfg, gen, nntr = load_model_configs(folder)
nntr.update(init_seq_len=32, num_to_generate=8, moe_expert_cache=cache)
model = Qwen3MoECausalLM(cfg, gen, nntr)
model.initialize()
model.load_weight(folder)
ids = (np.arange(32, dtype=np.float32) * 37 % 4000)[None]
logits = [model.model.incremental_inference(1, [ids], None, 32, 0, 32)[0][0]]
for k in range(6):
    step = np.array([[k * 11 + 5]], dtype=np.float32)
    logits.append(model.model.incremental_inference(1, [step], None, 1, 32 + k, 33 + k)[0][0])
np.save(out, np.stack(logits))
with open("/proc/self/status") as f:
    print(next(line.split()[1] for line in f if line.startswith("VmHWM:")))
"""


def write_big_expert_model(folder, E=32, I=512, H=256, L=2):
    """A random Qwen3-MoE folder (BF16 safetensors, per-expert tensors) whose experts hold
    L * E * 3 * H * I values: 100 MB as float32 with the defaults, the rest ~1 MB."""
    os.makedirs(folder)
    V = 4003
    cfg = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=H,
               num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=64,
               moe_intermediate_size=I, num_experts=E, num_experts_per_tok=2,
               norm_topk_prob=True, num_hidden_layers=L, tie_word_embeddings=True,
               rms_norm_eps=1e-6, max_position_embeddings=256, rope_theta=10000.0,
               vocab_size=V, hidden_act="silu", bos_token_id=4001, eos_token_id=4002)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    rng = np.random.default_rng(0)

    def r(*shape):
        return rng.standard_normal(shape, dtype=F32) * F32(0.1)
    t = {"model.embed_tokens.weight": r(V, H), "model.norm.weight": 1 + r(H)}
    for i in range(L):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": 1 + r(H), p + "post_attention_layernorm.weight": 1 + r(H),
                  p + "self_attn.q_proj.weight": r(32, H), p + "self_attn.k_proj.weight": r(16, H),
                  p + "self_attn.v_proj.weight": r(16, H), p + "self_attn.o_proj.weight": r(H, 32),
                  p + "self_attn.q_norm.weight": 1 + r(16), p + "self_attn.k_norm.weight": 1 + r(16),
                  p + "mlp.gate.weight": r(E, H)})
        for e in range(E):
            t[f"{p}mlp.experts.{e}.gate_proj.weight"] = r(I, H)
            t[f"{p}mlp.experts.{e}.up_proj.weight"] = r(I, H)
            t[f"{p}mlp.experts.{e}.down_proj.weight"] = r(H, I)
    write_safetensors(os.path.join(folder, "model.safetensors"), t, dtype="BF16")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(FIXTURES, "llama-gqa3", f), folder)
    return L * E * 3 * H * I * 4


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_expert_cache_keeps_peak_rss_low_with_identical_logits(tmp_path):
    """The child reports its peak RSS as VmHWM, the high-water mark of its own address space.
    (Its ``ru_maxrss`` would not do: Linux carries the parent's peak over fork + exec, so a
    child of this large pytest process starts at the parent's footprint.)"""
    folder = str(tmp_path / "big")
    expert_f32_bytes = write_big_expert_model(folder)
    peaks, logits = {}, {}
    for cache in (0, 2):
        out = str(tmp_path / f"logits{cache}.npy")
        p = subprocess.run([sys.executable, "-c", RSS_SCRIPT, folder, str(cache), out], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        peaks[cache] = int(p.stdout.split()[-1]) * 1024  # VmHWM is in kB
        logits[cache] = np.load(out)
    assert np.array_equal(logits[0], logits[2])
    assert peaks[2] + 0.8 * expert_f32_bytes < peaks[0], (peaks, expert_f32_bytes)


# ------------------------------------------------------------------------------ CLI
@pytest.mark.slow
def test_greedy_cli_gives_transformers_tokens():
    parity.check_cli("qwen3moe-e8k2-dense", "Qwen3MoeForCausalLM", 24)
