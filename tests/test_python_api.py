"""The Python entry point (causallm.load -> LoadedModel): generate, stream, reuse, chat
messages, embed.

Generated tokens are checked against what transformers produced for the llama-gqa3 fixture
(expected.npz, greedy, 32 new tokens), embeddings against sentence-transformers' for bert-st-mean;
the chat path against the text the embedded model's template defines ("Q: ...\\nA:" after the
BOS). One model is loaded per fixture and reused by every test: that reuse is itself under test.
"""

import os
import re

import numpy as np
import pytest

import causallm
import causallm.loader
from causallm.errors import CausalLMError
from causallm.loader import Stopped
from causallm.tokenizer import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
GQA3 = os.path.join(FIXTURES, "llama-gqa3")
BERT = os.path.join(FIXTURES, "bert-st-mean")
TINY = os.path.join(ROOT, "res", "tiny-llama")
OTHER_PROMPT = ("A much longer prompt, so that the second call finds the cache filled past "
                "where its own prompt ends: " * 3)


def expected(name="llama-gqa3"):
    ref = np.load(os.path.join(FIXTURES, name, "expected.npz"))
    return str(ref["prompt"]), ref["prompt_ids"].tolist(), ref["tokens"].tolist()


@pytest.fixture(scope="module")
def gqa3():
    return causallm.load(GQA3)


@pytest.fixture(scope="module")
def tiny():
    return causallm.load(TINY, num_to_generate=24)


@pytest.mark.slow
def test_greedy_generate_gives_transformers_tokens(gqa3):
    prompt, prompt_ids, tokens = expected()
    done = gqa3.complete(prompt, max_new_tokens=32, greedy=True)
    assert done.result.prompt_ids[0] == prompt_ids
    assert done.result.generated_ids[0] == tokens[:32]
    tokenizer = Tokenizer.FromFile(os.path.join(GQA3, "tokenizer.json"))
    assert done.text == tokenizer.Decode(tokens[:32], skip_special_tokens=True)
    assert (done.finish_reason, done.prompt_tokens, done.completion_tokens) == \
        ("length", len(prompt_ids), 32)
    assert gqa3.generate(prompt, max_new_tokens=32, greedy=True) == done.text


def test_stream_yields_the_text_in_pieces(gqa3):
    prompt, _, tokens = expected()
    pieces = list(gqa3.stream(prompt, max_new_tokens=32, greedy=True))
    assert len(pieces) > 1
    assert "".join(pieces) == gqa3.generate(prompt, max_new_tokens=32, greedy=True)
    assert list(gqa3.generate(prompt, stream=True, max_new_tokens=32, greedy=True)) == pieces


@pytest.mark.slow
def test_one_model_serves_many_calls(gqa3):
    """A longer prompt, then sampling, then the fixture's prompt without options: the KV cache
    and the sampling settings of earlier calls leave nothing behind."""
    prompt, _, tokens = expected()
    gqa3.generate(OTHER_PROMPT, max_new_tokens=40, temperature=1.5, top_k=0, seed=3)
    done = gqa3.complete(prompt, max_new_tokens=32)  # generation_config: do_sample false
    assert done.result.do_sample is False
    assert done.result.generated_ids[0] == tokens[:32]


@pytest.mark.slow
def test_sampling_with_a_seed_repeats(gqa3):
    prompt, _, tokens = expected()
    a = gqa3.complete(prompt, max_new_tokens=24, temperature=1.5, top_k=0, seed=7)
    b = gqa3.complete(prompt, max_new_tokens=24, temperature=1.5, top_k=0, seed=7)
    assert a.result.do_sample is True
    assert a.result.generated_ids == b.result.generated_ids
    assert a.result.generated_ids[0] != tokens[:24]


def test_should_stop_ends_the_generation_between_tokens(gqa3):
    prompt, _, tokens = expected()
    seen = []
    with pytest.raises(Stopped):
        gqa3.complete(prompt, max_new_tokens=32, greedy=True,
                      should_stop=lambda: len(seen) >= 3, on_text=seen.append)
    it = gqa3.stream(prompt, max_new_tokens=32, greedy=True)
    next(it)
    it.close()  # the worker stops at its next token and gives the model back
    assert gqa3.complete(prompt, max_new_tokens=32, greedy=True).result.generated_ids[0] == \
        tokens[:32]


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["Set", ["keys", "fin"]])
def test_stop_strings_cut_the_transformers_text(gqa3, stop):
    prompt, _, tokens = expected()
    tokenizer = Tokenizer.FromFile(os.path.join(GQA3, "tokenizer.json"))
    full = tokenizer.Decode(tokens[:32], skip_special_tokens=True)
    first = min(full.index(s) for s in ([stop] if isinstance(stop, str) else stop))
    done = gqa3.complete(prompt, max_new_tokens=32, greedy=True, stop=stop)
    assert (done.text, done.finish_reason) == (full[:first], "stop")
    assert "".join(gqa3.stream(prompt, max_new_tokens=32, greedy=True, stop=stop)) == \
        full[:first]
    assert gqa3.complete(prompt, max_new_tokens=32, greedy=True).text == full  # forgotten


def test_further_options_reach_the_generator(gqa3):
    prompt, _, tokens = expected()
    done = gqa3.complete(prompt, max_new_tokens=8, greedy=True, bad_words_ids=[[tokens[0]]])
    assert tokens[0] not in done.result.generated_ids[0]
    with pytest.raises(CausalLMError, match="complete: unknown option .bogus."):
        gqa3.generate(prompt, bogus=1)


@pytest.mark.slow
def test_chat_messages_go_through_the_folder_template(tiny):
    messages = [{"role": "user", "content": "What is a list?"}]
    done = tiny.complete(messages, greedy=True)
    tokenizer = Tokenizer.FromFile(os.path.join(TINY, "tokenizer.json"))
    # the template: BOS, "Q: <question>\nA:"; as a string prompt the tokenizer adds the BOS
    assert done.result.prompt_ids[0] == tokenizer.Encode("Q: What is a list?\nA:")
    assert done.result.prompt_ids[0][0] == 4001
    assert done.text == tiny.generate("Q: What is a list?\nA:", greedy=True)
    assert done.completion_tokens <= 24  # load(num_to_generate=24) is the default length


def test_token_ids_are_a_prompt(gqa3):
    prompt, prompt_ids, tokens = expected()
    assert gqa3.complete(prompt_ids, max_new_tokens=8, greedy=True).result.generated_ids[0] \
        == tokens[:8]


def test_bad_calls_are_one_line_errors(gqa3, tiny):
    with pytest.raises(CausalLMError, match="no chat template"):
        gqa3.generate([{"role": "user", "content": "hi"}])
    with pytest.raises(CausalLMError, match="max_new_tokens"):
        gqa3.generate("hi", max_new_tokens=0)
    with pytest.raises(CausalLMError, match="prompt must be"):
        gqa3.generate(42)
    with pytest.raises(CausalLMError, match="not an embedding model"):
        gqa3.embed("hi")
    with pytest.raises(CausalLMError, match="KV cache holds"):
        tiny.generate("word " * 1000)
    with pytest.raises(CausalLMError, match="max_new_tokens 513 is more than the context: 512 "
                                            "positions"):
        tiny.generate("hi", max_new_tokens=513)
    with pytest.raises(CausalLMError, match="not a model folder"):
        causallm.load(os.path.join(FIXTURES, "no-such-model"))
    assert tiny.generate("hi", max_new_tokens=2)  # still usable after its errors


@pytest.mark.parametrize("call, message", [
    (lambda m: m.generate("caf\udce9", max_new_tokens=2),  # bytes read with surrogateescape
     "the text to encode is not valid Unicode: a lone surrogate U+DCE9 at offset 3"),
    (lambda m: m.generate([{"role": "user", "content": "caf\udce9"}], max_new_tokens=2),
     "'messages[0].content' is not valid Unicode: a lone surrogate U+DCE9 at offset 3"),
    (lambda m: m.generate("hi", stop="\udce9", max_new_tokens=2),  # could never match
     "stop is not valid Unicode: a lone surrogate U+DCE9 at offset 0"),
    (lambda m: m.generate([{"role": "user", "content": None}], max_new_tokens=2),
     "'messages[0].content' must be a string or a list of parts (null only in an assistant "
     "message with tool_calls), got None"),
    (lambda m: m.generate([{"role": "user"}], max_new_tokens=2), "'messages[0].content' must be"),
    (lambda m: m.generate([{"role": 1, "content": "hi"}], max_new_tokens=2),
     "'messages[0].role' must be a string, got 1"),
    (lambda m: m.generate("hi", stream=1), "stream must be true or false, got 1"),
    (lambda m: m.generate("hi", num_beams=3),
     "not 3: set num_beams before initialize() (causallm.load(path, num_beams=3))"),
    (lambda m: causallm.load(5), "the model path must be a string or os.PathLike"),
    (lambda m: causallm.load(TINY.encode()), "the model path must be a string or os.PathLike"),
    (lambda m: causallm.load(TINY, plugins="no-such-plugin.py"),  # one file, not its letters
     "--plugin no-such-plugin.py: no such file"),
])
def test_bad_values_in_calls_are_named(tiny, call, message):
    """What the server refuses in a request (null content, text UTF-8 cannot hold) the Python
    API refuses too, naming it, instead of a TypeError from the tokenizer or a silent run."""
    with pytest.raises(CausalLMError) as e:
        call(tiny)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert tiny.generate("hi", max_new_tokens=2)


def test_a_path_object_loads():
    import pathlib

    assert causallm.load(pathlib.Path(TINY)).generate("hi", max_new_tokens=2)


@pytest.mark.slow
def test_load_options_are_the_defaults_of_every_call(gqa3):
    """load() takes a call's generation options, under the same names, as the defaults of every
    call (max_new_tokens as nntr_config num_to_generate, the CLI's -n); a call's own options
    win for that call only."""
    prompt, _, tokens = expected()
    short = causallm.load(GQA3, max_new_tokens=5, greedy=True)
    assert short.complete(prompt).result.generated_ids[0] == tokens[:5]
    assert short.complete(prompt, max_new_tokens=9).result.generated_ids[0] == tokens[:9]
    assert short.complete(prompt).completion_tokens == 5
    sampled = causallm.load(GQA3, temperature=1.5, top_k=0, seed=7)
    a = sampled.complete(prompt, max_new_tokens=24)
    assert a.result.do_sample is True
    assert a.result.generated_ids == gqa3.complete(prompt, max_new_tokens=24, temperature=1.5,
                                                   top_k=0, seed=7).result.generated_ids
    assert sampled.complete(prompt, max_new_tokens=24, greedy=True).result.generated_ids[0] \
        == tokens[:24]
    assert sampled.complete(prompt, max_new_tokens=24).result.generated_ids == \
        a.result.generated_ids


@pytest.mark.parametrize("options, message", [
    (dict(bogus_option=1), "load: unknown option 'bogus_option'; known: "),
    (dict(temprature=0.1), "load: unknown option 'temprature' (did you mean 'temperature'?)"),
    (dict(max_new_tokens=0), "max_new_tokens must be an integer >= 1, got 0"),
    (dict(temperature=-1), "temperature must be a finite number >= 0"),
    (dict(top_p=True), "top_p must be a number in [0, 1]"),
    (dict(stop=""), "stop must be a non-empty string or a list of them"),
    (dict(max_new_tokens=3, num_to_generate=4), "max_new_tokens or num_to_generate, not both"),
    (dict(threads=0), "threads must be an integer >= 1"),
])
def test_load_refuses_what_it_would_not_apply(options, message):
    with pytest.raises(CausalLMError) as e:
        causallm.load(TINY, **options)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
def test_a_model_computes_only_after_load_weight():
    """Factory -> initialize -> no load_weight: every entry that computes (run, generate_tokens,
    the graph's incremental_inference, an embedding) is a one-line error naming load_weight(),
    not tokens computed from the zeros the weights start as."""
    from causallm.factory import Factory

    model = Factory.Instance().createFromFolder(TINY, num_to_generate=4)
    model.initialize()
    embedder = Factory.Instance().createFromFolder(BERT)
    embedder.initialize()
    for call in (lambda: model.run("hi", log_output=False),
                 lambda: model.generate_tokens([[1, 2, 3]]),
                 lambda: model.model.incremental_inference(1, [np.zeros((1, 1), np.float32)],
                                                           None, 1, 0, 1),
                 lambda: embedder.encode("hi"), lambda: embedder.run("hi", log_output=False)):
        with pytest.raises(CausalLMError, match=r"load_weight\(\) was not called") as e:
            call()
        assert "\n" not in str(e.value)
    model.load_weight()
    assert len(model.run("hi", log_output=False).generated_ids[0]) == 4


def test_a_keyword_option_is_named_in_its_error():
    """An nntr_config option given as a keyword to load() / create() / createFromFolder is
    blamed as that keyword, not as nntr_config.json (which may not even say it)."""
    from causallm.factory import Factory

    for make in (causallm.load, causallm.loader.create, Factory.Instance().createFromFolder):
        with pytest.raises(CausalLMError) as e:
            make(TINY, num_to_generate=-3)
        assert str(e.value) == "num_to_generate must be an integer >= 1, got -3"
    with pytest.raises(CausalLMError) as e:
        causallm.load(TINY, system_prompt={"kvcache": {"pre_computed_cache_path": 5}})
    assert str(e.value) == "system_prompt.kvcache.pre_computed_cache_path must be a string, got 5"
    with pytest.raises(CausalLMError) as e:
        causallm.load(TINY, model_file_name="no-such.bin")
    assert str(e.value) == f"model_file_name: {os.path.join(TINY, 'no-such.bin')} does not exist"
    with pytest.raises(CausalLMError) as e:  # a folder without nntr_config.json: not ignored
        causallm.loader.create(GQA3, tokenizer_file="no-such.json")
    assert str(e.value) == (f"tokenizer_file: {os.path.join(GQA3, 'no-such.json')}: tokenizer "
                            f"file not found")
    with pytest.raises(CausalLMError) as e:
        causallm.loader.create(BERT, module_config_path="no-such.json")
    assert str(e.value) == (f"module_config_path: {os.path.join(BERT, 'no-such.json')}: file not "
                            f"found")
    with pytest.raises(CausalLMError) as e:  # a command-line flag keeps its name
        causallm.loader.create(TINY, flags={"num_to_generate": "-n"}, num_to_generate=0)
    assert str(e.value) == "-n (num_to_generate) must be an integer >= 1, got 0"


@pytest.mark.slow
def test_ctx_size_sizes_the_context_and_what_exceeds_it_is_refused_before_allocating():
    """ctx_size is the context (the KV cache rows), over nntr_config's max_seq_len; new tokens
    beyond it and a context beyond the memory are refused by load(), naming the keyword, before
    the graph is built; a call's max_new_tokens is checked against it."""
    small = causallm.load(TINY, ctx_size=64)
    assert small.context_length == 64
    cache = small.model.model.getKVCaches("self")[0]
    assert cache.key.shape[2] == 64
    assert small.complete("hi", max_new_tokens=64, greedy=True).finish_reason in ("stop",
                                                                                  "length")
    with pytest.raises(CausalLMError, match="max_new_tokens 65 is more than the context: 64"):
        small.generate("hi", max_new_tokens=65)
    with pytest.raises(CausalLMError, match=r"^num_to_generate 20000000 is more than the "
                                            r"context: 512 positions \(max_seq_len in "):
        causallm.load(TINY, num_to_generate=20000000)
    with pytest.raises(CausalLMError, match=r"^num_to_generate 100 is more than the context: "
                                            r"64 positions \(ctx_size\)"):
        causallm.load(TINY, ctx_size=64, num_to_generate=100)
    with pytest.raises(CausalLMError, match=r"^not enough memory for a context of 2147483648 "
                                            r"positions \(ctx_size\): .* GiB"):
        causallm.load(TINY, ctx_size=2**31)
    for bad in (0, -1, 1.5, "64", True):
        with pytest.raises(CausalLMError, match="ctx_size must be an integer >= 1"):
            causallm.load(TINY, ctx_size=bad)


def test_a_gguf_without_a_chat_template_says_what_a_gguf_lacks():
    """Chat messages to a GGUF whose metadata has no template: the message names the GGUF's key,
    not the files of a Hugging Face folder."""
    model = causallm.load(os.path.join(FIXTURES, "gguf-llama-q8_0", "model.gguf"))
    with pytest.raises(CausalLMError, match=r"has no chat template \(no tokenizer\.chat_template "
                                            r"in the GGUF's metadata\)") as e:
        model.generate([{"role": "user", "content": "hi"}])
    assert "tokenizer_config.json" not in str(e.value)


def test_embed_gives_sentence_transformers_embeddings():
    ref = np.load(os.path.join(BERT, "expected.npz"))
    sentences = [str(s) for s in ref["sentences"]]
    model = causallm.load(BERT)
    got = model.embed(sentences)
    assert got.shape == ref["embeddings"].shape and got.dtype == np.float32
    np.testing.assert_allclose(got, ref["embeddings"], atol=1e-5)
    np.testing.assert_allclose(model.embed(sentences[1]), ref["embeddings"][1:2], atol=1e-5)
    with pytest.raises(CausalLMError, match="does not generate"):
        model.generate("hi")
    with pytest.raises(CausalLMError, match=r"does not generate text: it takes no generation "
                                            r"options \(temperature\)"):
        causallm.load(BERT, temperature=0.5)


@pytest.mark.slow
def test_readme_example_runs(monkeypatch, capsys):
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    example = re.search(r"## Python API\n+```python\n(.*?)```", readme, re.S).group(1)
    monkeypatch.chdir(ROOT)  # it names res/tiny-llama
    scope = {}
    exec(example.replace('"EMBEDDING_DIR"', repr(BERT)), scope)
    assert isinstance(scope["model"], causallm.loader.LoadedModel)
    assert capsys.readouterr().out  # the streamed pieces


@pytest.mark.slow
def test_images_go_with_the_prompt():
    """Gemma 3's image-text fixture: the prompt with two images, transformers' greedy tokens;
    the images are for that call only."""
    ref = np.load(os.path.join(FIXTURES, "gemma3-vision", "expected.npz"))
    model = causallm.load(os.path.join(FIXTURES, "gemma3-vision"), num_to_generate=64)
    images = [os.path.join(ROOT, p) for p in ref["images"]]
    done = model.complete(str(ref["prompt"]), max_new_tokens=32, greedy=True, images=images)
    assert done.result.prompt_ids[0] == ref["prompt_ids"].tolist()
    assert done.result.generated_ids[0] == ref["tokens"].tolist()
    assert model.model.images == []
    with pytest.raises(CausalLMError, match="takes no images"):
        causallm.load(GQA3).generate("hi", images=images)
