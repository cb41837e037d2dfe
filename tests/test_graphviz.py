"""``--graph``: the compiled layer graph as Graphviz DOT (causallm/runtime/graphviz.py).

The DOT is parsed back (boxes per cluster, edges, each box's parameter count) and compared
with counts worked out by hand from each folder's config.json: how many layers a block has,
how many inputs each reads, how many weights each holds.
"""

import json
import os
import re
import shutil

import pytest

from causallm import main
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_LLAMA = os.path.join(ROOT, "res", "tiny-llama")
T5 = os.path.join(ROOT, "tests", "fixtures", "t5-relu-tied")


def config(folder):
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)


def parse_dot(text):
    """-> ({cluster: [node names]}, [(from, to)], {node: params}) of our DOT."""
    clusters, edges, params, current = {}, [], {}, None
    for line in text.splitlines():
        if m := re.match(r'\s*subgraph "cluster_(\w+)" \{$', line):
            current = clusters.setdefault(m.group(1), [])
        elif m := re.match(r'\s*"([^"]+)" -> "([^"]+)"', line):
            edges.append((m.group(1), m.group(2)))
        elif m := re.match(r'\s*"([^"]+)" \[label="(.*)"\];$', line):
            current.append(m.group(1))
            params[m.group(1)] = int(m.group(2).split("\\n")[-1].split()[0].replace(",", ""))
        elif line.strip() == "}":
            current = None
    return clusters, edges, params


def write_dot(capsys, model_dir, path):
    capsys.readouterr()
    assert main.main([model_dir, "--graph", str(path)]) == 0
    assert capsys.readouterr().err == f"graph written to {path}\n"
    return parse_dot(path.read_text())


def test_the_embedded_model_draws_every_layer_and_input(capsys, tmp_path):
    cfg = config(TINY_LLAMA)
    L, D, V, I = (cfg[k] for k in ("num_hidden_layers", "hidden_size", "vocab_size",
                                   "intermediate_size"))
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], \
        cfg["num_key_value_heads"] * cfg["head_dim"]
    clusters, edges, params = write_dot(capsys, TINY_LLAMA, tmp_path / "llama.dot")

    # a block: attention_norm, wq, wk, wv, attention, attention_out, decoder_add, ffn_norm,
    # ffn_up, ffn_gate, ffn_swiglu, ffn_down, decoder_output; then input0, embedding0,
    # output_norm and the (tied) head
    assert list(clusters) == ["model"]
    assert len(clusters["model"]) == L * 13 + 4
    # inputs per block: 1 + 3 (q, k, v) + 3 (attention) + 1 + 2 + 1 + 2 + 2 + 1 + 2;
    # embedding0, output_norm and the head read one each
    assert len(edges) == L * 18 + 3
    assert ("layer0_wq", "layer0_attention") in edges
    assert ("embedding0", "layer0_decoder_add") in edges
    assert (f"layer{L - 1}_decoder_output", "output_norm") in edges
    assert params["layer0_ffn_up"] == D * I
    block = 2 * D + D * q + 2 * D * kv + q * D + 3 * D * I
    assert sum(params.values()) == V * D + L * block + D  # the head shares the embedding


def test_an_encoder_decoder_draws_one_cluster_per_stage(capsys, tmp_path):
    cfg = config(T5)
    enc, dec = cfg["num_layers"], cfg["num_decoder_layers"]
    clusters, edges, _ = write_dot(capsys, T5, tmp_path / "t5.dot")

    assert list(clusters) == ["encoder", "decoder"]
    # encoder: input, embedding, position bias, final norm; 12 layers a block (attention_norm,
    # wq, wk, wv, attention, attention_out, encoder_add, ffn_norm, ffn_up, ffn_act, ffn_down,
    # encoder_output); and each decoder block's cross K and V projections, which read only
    # the encoder's output and so run with it
    cross_kv = {f"decoder_layer{i}_cross_w{x}" for i in range(dec) for x in "kv"}
    assert cross_kv <= set(clusters["encoder"])
    assert len(clusters["encoder"]) == 4 + 12 * enc + 2 * dec
    # decoder: input, embedding, position bias, final norm, head; 17 layers a block (self:
    # norm, wq, wk, wv, attention, attention_out, add; cross: norm, wq, attention,
    # attention_out, add; ffn_norm, ffn_up, ffn_act, ffn_down, decoder_output)
    assert len(clusters["decoder"]) == 5 + 17 * dec
    assert ("encoder_output_norm", "decoder_layer0_cross_wk") in edges
    assert ("decoder_layer0_cross_wk", "decoder_layer0_cross_attention") in edges
    # inputs: encoder block 1+3+4(q,k,v,bias)+1+2+1+1+1+1+2 = 17; decoder block 1+3+4+1+2
    # (self) +1+1+2+3+1+2 (cross) +1+1+1+1+2 (ffn) = 27; embeddings, biases, norms, head: 7
    assert len(edges) == 17 * enc + 27 * dec + 7


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_an_svg_is_laid_out_by_graphviz(capsys, tmp_path):
    path = tmp_path / "llama.svg"
    assert main.main([TINY_LLAMA, "--graph", str(path)]) == 0
    svg = path.read_text()
    assert "<svg" in svg and "layer0_attention_norm" in svg


def test_an_svg_without_graphviz_is_a_one_line_error(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no dot on it
    capsys.readouterr()
    assert main.main([TINY_LLAMA, "--graph", str(tmp_path / "g.svg")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --graph {tmp_path / 'g.svg'}: an SVG needs Graphviz's 'dot'")
    assert err.count("\n") == 1
    assert not (tmp_path / "g.svg").exists()


def test_an_unknown_graph_extension_is_a_one_line_error(capsys, tmp_path):
    capsys.readouterr()
    assert main.main([TINY_LLAMA, "--graph", str(tmp_path / "g.png")]) == 2
    assert capsys.readouterr().err == (f"error: --graph {tmp_path / 'g.png'}: expected a .dot, "
                                       f".gv or .svg file name\n")
