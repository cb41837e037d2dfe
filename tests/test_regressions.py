"""Regressions found by review: each test names the bug it pins down."""

import json
import os

import numpy as np
import pytest
from cli import run_cli

from causallm.api import createLayer, createModel, withKey
from causallm.errors import CausalLMError
from causallm.io.config import load_model_configs
from causallm.models.causal_lm import CausalLM

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "llama-gqa3")


def model_dir(tmp_path, generation=None, nntr=None):
    """The llama-gqa3 fixture with its own generation_config.json / nntr_config.json."""
    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        os.symlink(os.path.join(FIXTURE, name), folder / name)
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation))
    if nntr is not None:
        (folder / "nntr_config.json").write_text(json.dumps(nntr))
    return str(folder)


def last_json(out):
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_config_temperature_zero_with_do_sample_is_greedy(tmp_path):
    # was: "error: temperature must be > 0 when sampling", though --temp 0 means greedy
    folder = model_dir(tmp_path, {"do_sample": True, "temperature": 0, "eos_token_id": 4002},
                       {"init_seq_len": 8, "num_to_generate": 6})
    p = run_cli(folder, "hello world", "--json")
    assert p.returncode == 0
    record = last_json(p.stdout)
    assert record["do_sample"] is False
    p = run_cli(folder, "hello world", "--json", "--greedy")
    assert last_json(p.stdout)["generated_ids"] == record["generated_ids"]


def test_empty_bos_token_list_is_no_bos(tmp_path):
    # was: IndexError (a traceback-class error, exit status 1)
    cfg, gen, nntr = load_model_configs(model_dir(tmp_path, {"bos_token_id": []}))
    assert CausalLM(cfg, gen, nntr).BOS_TOKEN_ID == 4001  # config.json's


@pytest.mark.parametrize("key, value", [("top_p", 1.5), ("temperature", -1.0),
                                        ("repetition_penalty", 0.0)])
def test_bad_sampling_values_name_the_file(tmp_path, key, value):
    # was: a one-line error that did not say which file or key was wrong
    folder = model_dir(tmp_path, {key: value}, {"init_seq_len": 8, "num_to_generate": 2})
    p = run_cli(folder, "hello")
    code, err = p.returncode, p.stderr
    assert code == 2
    assert "generation_config.json" in err and f"'{key}'" in err
    assert len(err.strip().splitlines()) == 1


def test_out_of_memory_buffers_are_a_one_line_user_error(tmp_path, monkeypatch):
    # was: "error: MemoryError: ..." with exit status 1 (e.g. -n 2000000000)
    from causallm.runtime.graph import Model

    def no_memory(self, mode=None):
        raise MemoryError("Unable to allocate 59.6 GiB")
    monkeypatch.setattr(Model, "initialize", no_memory)
    folder = model_dir(tmp_path, None, {"init_seq_len": 4})
    p = run_cli(folder, "hello", "-n", "5")
    code, err = p.returncode, p.stderr
    assert code == 2
    assert "a context of 256 positions" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_generate_tokens_rejects_zero_new_tokens():
    # was: max_new_tokens=0 still produced one token
    cfg, gen, nntr = load_model_configs(FIXTURE)
    nntr.update(init_seq_len=8, num_to_generate=4)
    model = CausalLM(cfg, gen, nntr)
    model.initialize()
    model.load_weight(FIXTURE)
    with pytest.raises(CausalLMError, match="max_new_tokens"):
        model.generate_tokens([[4001, 5, 6]], max_new_tokens=0)
    assert len(model.generate_tokens([[4001, 5, 6]], max_new_tokens=1).generated_ids[0]) == 1


def _tiny_model():
    model = createModel()
    model.addLayer(createLayer("input", [withKey("name", "in"), withKey("input_shape", "1:1:4")]))
    model.addLayer(createLayer("fully_connected", [withKey("name", "fc"), withKey("unit", 3)]))
    return model


def test_batch_size_cannot_change_after_compile():
    # was: accepted silently; the buffers kept the old batch and every step then failed
    model = _tiny_model()
    model.compile()
    with pytest.raises(CausalLMError, match="before compile"):
        model.setProperty([withKey("batch_size", 2)])


def test_input_not_divisible_by_batch_is_a_user_error():
    # was: numpy's "cannot reshape array" ValueError
    model = _tiny_model()
    model.setProperty([withKey("batch_size", 2)])
    model.compile()
    model.initialize()
    model.setWeight("fc:weight", np.ones((4, 3), np.float32))
    with pytest.raises(CausalLMError, match="multiple of batch 2"):
        model.incremental_inference(2, [np.zeros(3, dtype=np.float32)], None, 1, 0, 1)
