"""Weight tables (causallm/io/weight_table.py): expansion against a graph's weights, aliases,
prefixes, ignored buffers, parts (Split, Every, pattern fields) and the export back."""

import numpy as np
import pytest

from causallm.errors import CausalLMError
from causallm.io.weight_table import Every, Split, Tensor, WeightTable

F32 = np.float32


class DictCheckpoint:
    """A checkpoint held in a dict, with the methods WeightTable.load uses."""

    folder = "ckpt"

    def __init__(self, tensors):
        self.tensors = {k: np.asarray(v, dtype=F32) for k, v in tensors.items()}

    def keys(self):
        return list(self.tensors)

    def get(self, name, zeros=False):
        return self.tensors[name]

    def file_of(self, name):
        return "ckpt/model.safetensors"


TABLE = WeightTable([
    Tensor("emb:Embedding", "shared.weight", aliases=("encoder.embed.weight", "lm_head.weight")),
    Tensor("layer{i}_w{p}:weight", "layers.{i}.{p}.weight", transpose=True),
    Tensor("layer{i}_moe:expert_gate_{e}", "layers.{i}.experts.gate_up",
           part=("e", slice(None), Every(0, 2))),
    Tensor("layer{i}_moe:expert_up_{e}", "layers.{i}.experts.gate_up",
           part=("e", slice(None), Every(1, 2))),
    Tensor("layer{i}_qkv_{p}:bias", "layers.{i}.fused.bias", part=(...,)),
    Tensor("head:weight", "lm_head.weight", transpose=True),
    Tensor("norm:gamma", "norm.weight", offset=1.0),
], ignore=["layers.{i}.rotary.inv_freq", "pooler.*"], prefixes=["model."])


def load(table, names, tensors):
    got = {}
    table.load(DictCheckpoint(tensors), table.weightMap(names), got.__setitem__)
    return got


def test_rows_expand_against_the_graph_weights_only():
    m = TABLE.weightMap(["emb:Embedding", "layer0_wq:weight", "layer1_wk:weight", "norm:gamma"])
    assert list(m) == ["shared.weight", "layers.0.q.weight", "layers.1.k.weight", "norm.weight"]
    (part,) = m["layers.1.k.weight"]
    assert (part.target, part.transpose, part.index) == ("layer1_wk:weight", True, None)
    with pytest.raises(CausalLMError, match="model's weight table maps no checkpoint tensor to: "
                                            "extra:weight"):
        TABLE.weightMap(["emb:Embedding", "extra:weight"])


def test_aliases_ignores_and_prefixes():
    emb, other = np.arange(6).reshape(3, 2), np.ones((3, 2))
    # the primary wins over a (tied) alias; ignored buffers and a missing prefix are fine
    got = load(TABLE, ["emb:Embedding", "norm:gamma"],
               {"model.shared.weight": emb, "lm_head.weight": other, "norm.weight": [1, 2],
                "layers.3.rotary.inv_freq": [0], "pooler.dense.weight": [0]})
    np.testing.assert_array_equal(got["emb:Embedding"], emb)
    np.testing.assert_array_equal(got["norm:gamma"], [2, 3])
    # only an alias present: it is read
    got = load(TABLE, ["emb:Embedding"], {"encoder.embed.weight": emb})
    np.testing.assert_array_equal(got["emb:Embedding"], emb)
    # an untied head claims lm_head.weight as its own tensor
    got = load(TABLE, ["emb:Embedding", "head:weight"],
               {"shared.weight": emb, "lm_head.weight": other})
    np.testing.assert_array_equal(got["head:weight"], other.T)


def test_unused_and_missing_tensors_are_named():
    with pytest.raises(CausalLMError) as e:
        load(TABLE, ["emb:Embedding", "norm:gamma"], {"shared.weight": [[0]], "stray.weight": [0]})
    message = str(e.value)
    assert "1 checkpoint tensor(s) match no weight of model: stray.weight" in message
    assert "1 tensor(s) missing from the checkpoint: norm.weight" in message
    assert "\n" not in message


def test_parts_split_every_and_fields_round_trip():
    table = TABLE.extend([Tensor("layer{i}_c{j}:weight", "layers.{i}.c_attn.weight",
                                 part=(..., Split(0, 2))),
                          Tensor("layer{i}_d{j}:weight", "layers.{i}.c_attn.weight",
                                 part=(..., Split(1, 2)))])
    rng = np.random.default_rng(0)
    gate_up = rng.standard_normal((3, 4, 6)).astype(F32)   # [E, H, 2I], gate even, up odd
    c_attn = rng.standard_normal((4, 8)).astype(F32)
    names = [f"layer0_moe:expert_{w}_{e}" for e in range(3) for w in ("gate", "up")] + \
        ["layer0_c0:weight", "layer0_d0:weight"]
    m = table.weightMap(names)
    got = load(table, names, {"layers.0.experts.gate_up": gate_up,
                              "layers.0.c_attn.weight": c_attn})
    np.testing.assert_array_equal(got["layer0_moe:expert_gate_2"], gate_up[2, :, 0::2])
    np.testing.assert_array_equal(got["layer0_moe:expert_up_1"], gate_up[1, :, 1::2])
    np.testing.assert_array_equal(got["layer0_d0:weight"], c_attn[:, 4:])
    back = WeightTable.export(m, got.__getitem__)
    np.testing.assert_array_equal(back["layers.0.experts.gate_up"], gate_up)
    np.testing.assert_array_equal(back["layers.0.c_attn.weight"], c_attn)


def test_split_of_an_uneven_axis_is_an_error():
    table = WeightTable([Tensor("a:weight", "t", part=(Split(0, 3),))])
    with pytest.raises(CausalLMError, match="tensor 't' of shape \\(4,\\): axis 0 of length 4 "
                                            "does not split into 3 equal parts"):
        load(table, ["a:weight"], {"t": np.zeros(4)})
