"""Structured output (causallm/generation/constraint.py): generation held to JSON, or to a JSON
schema, by llguidance's token masks.

Checked against what is not our code: the generated text parses with Python's ``json`` and
validates with ``jsonschema`` (by hand where it is not installed); a GGUF vocabulary's token
bytes spell the ids transformers' and llama.cpp's tokenizers gave for real texts
(tests/fixtures/gguf-llama-spm, gguf-tokenizer-ids.json), and its masks equal the ones
llguidance computes from the ``tokenizer.json`` of the same vocabulary; the mask kernel equals a
numpy twin. The fixture models are tiny and random: what they write is nonsense, but it parses.
Without llguidance the tests that need it are skipped (.ci/run installs it with the test extra).
"""

import importlib.util
import json
import os
import sys

import numpy as np
import pytest

import causallm
from causallm import main
from causallm.errors import CausalLMError
from causallm.generation.options import Options
from causallm.generation.sampler import Sampler
from causallm.generation.settings import GenerationSettings
from causallm.io.gguf_file import GGUFFile
from causallm.kernels.token_mask import apply_token_bitmask
from causallm.tokenizer import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
TINY = os.path.join(ROOT, "res", "tiny-llama")
GQA3 = os.path.join(FIXTURES, "llama-gqa3")
SPM = os.path.join(FIXTURES, "gguf-llama-spm", "model.gguf")
QWEN3_GGUF = os.path.join(FIXTURES, "gguf-qwen3-q4_0", "model.gguf")  # tiny-llama's vocabulary

HAVE_LLGUIDANCE = importlib.util.find_spec("llguidance") is not None
needs_llguidance = pytest.mark.skipif(not HAVE_LLGUIDANCE,
                                      reason='pip install "causallm[grammar]" (llguidance)')
if HAVE_LLGUIDANCE:
    from causallm.generation.constraint import (
        WHITESPACE,
        compile_json_schema,
        compile_response_format,
        grammar_tokenizer,
    )

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "ok", "tags"],
    "additionalProperties": False,
}
"""A schema whose values are bounded, so even a random model finishes one within the tokens
allowed."""


def validate(value, schema=PERSON):
    """``value`` against ``schema``: with jsonschema when installed, else PERSON by hand."""
    if importlib.util.find_spec("jsonschema") is not None:
        import jsonschema

        jsonschema.validate(value, schema)
        return
    assert schema is PERSON
    assert isinstance(value, dict) and list(value) == ["name", "age", "ok", "tags"]
    assert isinstance(value["name"], str) and len(value["name"]) <= 12
    assert type(value["age"]) is int and 0 <= value["age"] <= 120
    assert type(value["ok"]) is bool
    assert value["tags"] == [t for t in value["tags"] if t in "abc"] and len(value["tags"]) <= 3


# ----------------------------------------------------------------------- the mask kernel
def mask_twin(scores, bits, n):
    """apply_token_bitmask in numpy: bit i of the little-endian words allows id i."""
    out = scores.copy()
    m = min(n, len(out))
    allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[:m].astype(bool)
    out[:m][~allowed] = -np.inf
    out[m:] = -np.inf
    return out, int(allowed.sum())


@pytest.mark.parametrize("V, n", [(4003, 4003), (4064, 4003), (100, 4003), (64, 64), (31, 31),
                                  (1000, 33)])
def test_mask_kernel_equals_its_numpy_twin(V, n):
    rng = np.random.default_rng(V + n)
    words = rng.integers(-2**31, 2**31, size=(n + 31) // 32, dtype=np.int64).astype(np.int32)
    words[::3] = -1   # whole words allowed, and whole words refused: the kernel's short cuts
    words[1::5] = 0
    scores = rng.standard_normal(V).astype(np.float32)
    scores[::7] = -np.inf  # already refused by a processor: stays refused
    expected, count = mask_twin(scores, words, n)
    got = scores.copy()
    assert apply_token_bitmask(got, words, n) == count
    np.testing.assert_array_equal(got, expected)


# ----------------------------------------------------------------------- token bytes
def test_sentencepiece_gguf_token_bytes_spell_transformers_ids():
    """gguf-llama-spm's expected.npz: the ids transformers' GGUF tokenizer gave each text (after
    the BOS); their bytes joined are the text (with Llama's space prefix before a first piece
    that is not an added token)."""
    tokenizer = GGUFFile(SPM).tokenizer()
    pieces = tokenizer.token_bytes()
    ref = np.load(os.path.join(FIXTURES, "gguf-llama-spm", "expected.npz"))
    for text, ids in zip(ref["texts"].tolist(), ref["text_ids"].tolist()):
        joined = b"".join(pieces[i] for i in json.loads(ids)[1:])
        assert joined in (text.encode(), b" " + text.encode()), text
    assert tokenizer.special_ids() == [1, 2]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_real_gguf_token_bytes_spell_llama_cpp_ids(name, request):
    """gguf-tokenizer-ids.json: the ids llama.cpp gave 10 texts on the real files (the chat
    markup's control tokens among them, as they are spelled); their bytes after the BOS are
    the text."""
    with open(os.path.join(FIXTURES, "gguf-tokenizer-ids.json"), encoding="utf-8") as f:
        record = json.load(f)[name]
    tokenizer = GGUFFile(request.getfixturevalue(f"{name}_gguf")).tokenizer()
    pieces = tokenizer.token_bytes()
    for case in record["cases"]:
        ids = case["ids"][1:] if case["ids"][0] == tokenizer.bos else case["ids"]
        assert b"".join(pieces[i] for i in ids) == case["text"].encode(), case["text"]


# ----------------------------------------------------------------------- compiling
@pytest.mark.slow
@needs_llguidance
def test_response_formats_compile_or_fail_in_one_line_naming_the_field():
    tokenizer = Tokenizer.FromFile(os.path.join(TINY, "tokenizer.json"))
    assert grammar_tokenizer(tokenizer) is grammar_tokenizer(tokenizer)  # built once
    assert compile_response_format(tokenizer, None) is None
    assert compile_response_format(tokenizer, {"type": "text"}) is None
    assert compile_response_format(tokenizer, {"type": "json_object"}).kind == "json_object"
    rf = compile_response_format(tokenizer, {"type": "json_schema", "json_schema": {
        "name": "person", "schema": PERSON, "strict": True}})
    assert (rf.kind, rf.name, rf.schema) == ("json_schema", "person", PERSON)
    bad = [
        ({"type": "json"}, "response_format: expected an object whose 'type' is"),
        ("json_object", "response_format: expected an object whose 'type' is"),
        ({"type": "json_schema"}, "response_format.json_schema: expected an object"),
        ({"type": "json_schema", "json_schema": {"name": "x"}},
         "response_format.json_schema.schema: missing"),
        ({"type": "json_schema", "json_schema": {"name": 3, "schema": {}}},
         "response_format.json_schema.name: expected a string"),
        ({"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}},
         "response_format.json_schema.strict: expected true or false"),
        ({"type": "json_schema", "json_schema": {"schema": {"type": "strin"}}},
         "response_format.json_schema.schema: Invalid type: strin"),
        ({"type": "json_schema", "json_schema": {"schema": [1]}},
         "response_format.json_schema.schema: a JSON Schema must be a JSON object, got list"),
    ]
    for response_format, message in bad:
        with pytest.raises(CausalLMError) as e:
            compile_response_format(tokenizer, response_format)
        assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


@needs_llguidance
@pytest.mark.parametrize("schema, message", [
    ({"type": "object", "properties": 5}, "properties must be an object"),
    ({"type": "string", "minLength": -1}, "minLength"),
    ({"$ref": "#/$defs/missing"}, "/$defs/missing"),
    ({"type": "integer", "minimum": 5, "maximum": 2}, "Unsatisfiable schema"),
    ({"type": "string", "pattern": "(?=a)b"}, "look-around"),
    ({"not": {"type": "string"}}, "Unimplemented keys: [\"not\"]"),
    ({"type": "string", "format": "colour"}, "Unknown format: colour"),
])
def test_a_bad_or_unsupported_schema_is_a_one_line_error(schema, message):
    tokenizer = Tokenizer.FromFile(os.path.join(TINY, "tokenizer.json"))
    with pytest.raises(CausalLMError) as e:
        compile_json_schema(tokenizer, schema)
    text = str(e.value)
    assert text.startswith("json_schema: ") and message in text and "\n" not in text, text


@needs_llguidance
def test_strict_false_ignores_the_keywords_llguidance_does_not_support():
    tokenizer = Tokenizer.FromFile(os.path.join(TINY, "tokenizer.json"))
    schema = {"type": "string", "format": "colour", "not": {"const": "x"}}
    assert compile_json_schema(tokenizer, schema, strict=False).kind == "json_schema"
    with pytest.raises(CausalLMError, match="Unimplemented keys|Unknown format"):
        compile_json_schema(tokenizer, schema, strict=True)


def test_without_llguidance_a_schema_is_a_one_line_error_naming_the_package(monkeypatch):
    from causallm.generation import constraint

    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance -> ImportError
    tokenizer = Tokenizer.FromFile(os.path.join(TINY, "tokenizer.json"))
    with pytest.raises(CausalLMError) as e:
        constraint.compile_response_format(tokenizer, {"type": "json_object"})
    assert "llguidance" in str(e.value) and 'pip install "causallm[grammar]"' in str(e.value)
    assert "\n" not in str(e.value)


@needs_llguidance
def test_a_tokenizer_llguidance_cannot_read_is_a_one_line_error():
    tokenizer = Tokenizer.FromFile(os.path.join(FIXTURES, "t5-flan-short", "tokenizer.json"))
    with pytest.raises(CausalLMError) as e:
        compile_response_format(tokenizer, {"type": "json_object"})
    assert "structured output cannot use this tokenizer" in str(e.value)
    assert "t5-flan-short" in str(e.value) and "\n" not in str(e.value)


# ----------------------------------------------------------------------- masks
def ids_of(tokenizer, text):
    """``text``'s ids as the continuation of a text (no BOS, no space prefix)."""
    backend = tokenizer.backend
    if hasattr(backend, "encode_continuation"):
        return backend.encode_continuation(text)
    return tokenizer.Encode(text, add_special_tokens=False)


def walk(response_format, tokenizer, text, V, eos=()):
    """Feed ``text``'s tokens through a new constraint, masking a (V,) row before each: every
    token must be allowed and every mask must allow something. Returns the constraint and the
    masked rows."""
    constraint = response_format.constraint(eos)
    rows = []
    for t in ids_of(tokenizer, text):
        assert not constraint.done
        row = np.zeros(V, np.float32)
        constraint.mask(row)
        assert np.isfinite(row).any() and row[t] == 0.0, tokenizer.IdToToken(t)
        rows.append(row)
        constraint.advance(t)
    return constraint, rows


TEXTS = ['{"name": "Ada", "age": 36, "ok": true, "tags": ["a", "c"]}',
         '{\n  "name": "x y",\n  "age": 0,\n  "ok": false,\n  "tags": []\n}',
         '{ "name" : "é\\"\\n\\u001f", "age" : 120 , "ok" : true , "tags" : [ "b" ] }']


@pytest.mark.slow
@needs_llguidance
@pytest.mark.parametrize("source", ["tokenizer.json", "gguf-byte-level", "gguf-sentencepiece"])
def test_json_texts_walk_through_the_mask(source):
    """Compact, pretty-printed and spaced JSON of the schema is allowed token by token, for a
    tokenizer.json and for GGUF vocabularies (byte-level and SentencePiece); the value is done
    at its closing brace; ids past the vocabulary (a padded embedding) are always refused."""
    tokenizer = {"tokenizer.json": lambda: Tokenizer.FromFile(os.path.join(TINY,
                                                                           "tokenizer.json")),
                 "gguf-byte-level": lambda: Tokenizer(GGUFFile(QWEN3_GGUF).tokenizer()),
                 "gguf-sentencepiece": lambda: Tokenizer(GGUFFile(SPM).tokenizer())}[source]()
    V = tokenizer.GetVocabSize() + 61
    for rf in (compile_json_schema(tokenizer, PERSON),
               compile_response_format(tokenizer, {"type": "json_object"})):
        for text in TEXTS:
            validate(json.loads(text))
            constraint, rows = walk(rf, tokenizer, text, V)
            assert constraint.done
            assert all(np.all(row[tokenizer.GetVocabSize():] == -np.inf) for row in rows)
    constraint, _ = walk(compile_json_schema(tokenizer, PERSON), tokenizer, '{"name": "x', V)
    assert not constraint.done
    constraint, _ = walk(compile_json_schema(tokenizer, PERSON), tokenizer, '{"name":', V)
    row = np.zeros(V, np.float32)
    constraint.mask(row)  # a string comes next: no digit
    assert all(row[ids_of(tokenizer, d)[0]] == -np.inf for d in "0123456789")
    assert row[ids_of(tokenizer, '"')[0]] == 0.0


@pytest.mark.slow
@needs_llguidance
def test_gguf_vocabulary_masks_equal_those_of_its_tokenizer_json():
    """gguf-qwen3-q4_0 holds tiny-llama's vocabulary: the masks llguidance computes from our GGUF
    token bytes are the ones it computes from the tokenizer.json itself, at every step."""
    json_tok = Tokenizer.FromFile(os.path.join(TINY, "tokenizer.json"))
    gguf_tok = Tokenizer(GGUFFile(QWEN3_GGUF).tokenizer())
    for text in TEXTS:
        masks = [walk(compile_json_schema(t, PERSON), t, text, 4003, eos=[4002])[1]
                 for t in (json_tok, gguf_tok)]
        assert len(masks[0]) == len(masks[1])
        for a, b in zip(*masks):
            np.testing.assert_array_equal(a, b)


@needs_llguidance
def test_eos_is_allowed_exactly_when_the_value_is_complete():
    tokenizer = Tokenizer.FromFile(os.path.join(TINY, "tokenizer.json"))
    eos = 4002
    integer = compile_json_schema(tokenizer, {"type": "integer"})
    constraint = integer.constraint([eos])
    row = np.zeros(4003, np.float32)
    constraint.mask(row)
    assert row[eos] == -np.inf  # nothing yet: not a value
    constraint.advance(tokenizer.Encode("12", add_special_tokens=False)[0])
    row[:] = 0
    constraint.mask(row)
    assert row[eos] == 0.0 and not constraint.done  # "12" is complete, "123" would be too
    constraint.advance(eos)
    assert constraint.done
    # without EOS ids the row's own ids decide: the grammar's EOS (a special token) never shows
    constraint = integer.constraint([])
    constraint.advance(tokenizer.Encode("7", add_special_tokens=False)[0])
    row[:] = 0
    constraint.mask(row)
    assert row[4001] == -np.inf and row[eos] == -np.inf


@needs_llguidance
def test_whitespace_is_bounded():
    """One space, or a newline and at most 20 spaces or tabs, where JSON allows whitespace;
    none before the value or after it."""
    tokenizer = Tokenizer.FromFile(os.path.join(TINY, "tokenizer.json"))
    rf = compile_response_format(tokenizer, {"type": "json_object"})

    def accepted(text):
        constraint = rf.constraint()
        ids = tokenizer.Encode(text, add_special_tokens=False)
        return constraint._matcher.try_consume_tokens(ids) == len(ids)

    assert WHITESPACE == r"\x20|\x0A[\x20\x09]{0,20}"
    assert accepted('{ "a" : 1 }') and accepted('{\n' + ' ' * 20 + '"a": 1}')
    assert not accepted('{\n' + ' ' * 21 + '"a": 1}')
    assert not accepted('{\n\n"a": 1}') and not accepted('{  "a": 1}')
    assert not accepted(' {}') and not accepted('{}\n')


# ----------------------------------------------------------------------- the sampler
@needs_llguidance
def test_the_mask_comes_after_the_processors_and_before_the_warpers():
    """top_k=1 keeps the best *allowed* token: were top-k applied before the mask, only a
    refused token would survive it and nothing could be drawn."""
    tokenizer = Tokenizer.FromFile(os.path.join(TINY, "tokenizer.json"))
    brace = tokenizer.TokenToId("{")
    logits = np.zeros((1, 4003), np.float32)
    logits[0, 7] = 10.0          # the model's favourite, which JSON cannot start with
    logits[0, brace] = 1.0
    constraint = compile_response_format(tokenizer, {"type": "json_object"}).constraint()
    for sampler in (Sampler(do_sample=False), Sampler(top_k=1, do_sample=True, seed=0),
                    Sampler(do_sample=True, seed=0, processors=[])):
        assert sampler.select(logits, [[1]], [constraint]).tolist() == [brace]
    assert logits[0, 7] == 10.0  # the caller's logits untouched


# ----------------------------------------------------------------------- generation
@pytest.fixture(scope="module")
def tiny():
    return causallm.load(TINY)


@pytest.fixture(scope="module")
def gqa3():
    return causallm.load(GQA3)


@pytest.fixture(scope="module")
def spm():
    return causallm.load(SPM)


@pytest.mark.slow
@needs_llguidance
@pytest.mark.parametrize("model", ["tiny", "gqa3", "spm"])
def test_generated_text_parses_and_validates(model, request):
    """Greedy and sampled, with a tokenizer.json and a GGUF vocabulary: the text is JSON valid
    under the schema, ended by the grammar (finish reason stop) well before the token limit."""
    lm = request.getfixturevalue(model)
    for options in (dict(greedy=True), dict(temperature=1.0, seed=1), dict(temperature=0.7,
                                                                          seed=2, top_p=0.9)):
        done = lm.complete("Give me JSON:", max_new_tokens=150, json_schema=PERSON, **options)
        value = json.loads(done.text)
        validate(value)
        assert done.finish_reason == "stop" and done.result.finish_reasons == ["stop"]
        assert done.completion_tokens < 150
        assert lm.model.tokenizer.Decode(done.result.generated_ids[0],
                                         skip_special_tokens=True) == done.text


@pytest.mark.slow
@needs_llguidance
def test_batch_rows_keep_their_own_grammar():
    """Two sampled rows of one batch: each is its own JSON value and stops when it is complete,
    the other going on."""
    lm = causallm.load(GQA3, batch_size=2)
    result = lm.complete("Give me JSON:", max_new_tokens=150, temperature=1.0, seed=5,
                         json_schema=PERSON).result
    assert result.finish_reasons == ["stop", "stop"]
    assert len(set(map(len, result.generated_ids))) == 2  # they ended at different steps
    for text in result.texts:
        validate(json.loads(text))


@needs_llguidance
@pytest.mark.parametrize("model", ["tiny", "gqa3"])
def test_json_object_gives_a_json_object(model, request):
    lm = request.getfixturevalue(model)
    done = lm.complete("Give me JSON:", max_new_tokens=100, greedy=True,
                       response_format={"type": "json_object"})
    assert isinstance(json.loads(done.text), dict) and done.finish_reason == "stop"
    pieces = []
    streamed = lm.complete("Give me JSON:", max_new_tokens=100, greedy=True,
                           on_text=pieces.append,
                           response_format={"type": "json_object"})
    assert "".join(pieces) == streamed.text == done.text


@pytest.mark.slow
@needs_llguidance
def test_a_call_without_a_format_is_free_again(tiny):
    constrained = tiny.complete("The for statement", max_new_tokens=12, greedy=True,
                                response_format={"type": "json_object"})
    free = tiny.complete("The for statement", max_new_tokens=12, greedy=True)
    assert constrained.text.startswith("{") and not free.text.startswith("{")
    assert free.text == causallm.load(TINY).complete("The for statement", max_new_tokens=12,
                                                     greedy=True).text


@pytest.mark.slow
@needs_llguidance
def test_options_that_cannot_go_with_a_format_are_one_line_errors(tiny):
    cases = [
        (dict(json_schema=PERSON, response_format={"type": "json_object"}),
         "give response_format or json_schema, not both"),
        (dict(json_schema={"type": "strin"}), "json_schema: Invalid type: strin"),
    ]
    for options, message in cases:
        with pytest.raises(CausalLMError) as e:
            tiny.model.setGenerationOptions(**options)
        assert message in str(e.value) and "\n" not in str(e.value)
        assert tiny.model.generation.response_format is None  # a refused option changes nothing
    beams = causallm.load(TINY, num_beams=2)
    with pytest.raises(CausalLMError, match="does not go with 2 beams"):
        beams.complete("Answer:", json_schema=PERSON)
    bart = causallm.load(os.path.join(FIXTURES, "bart-forced"))
    with pytest.raises(CausalLMError, match="forced_bos_token_id / forced_eos_token_id"):
        bart.complete("hello", json_schema=PERSON)


@needs_llguidance
def test_generator_settings_carry_the_compiled_format(tiny):
    settings = tiny.model.generationSettings(tiny.model.generation.withOptions(
        Options.check(dict(json_schema=PERSON)), tiny.model.tokenizer))
    assert settings.response_format.kind == "json_schema"
    assert tiny.model.generation.response_format is None  # the model's own are not changed
    assert GenerationSettings().response_format is None


@pytest.mark.slow
@needs_llguidance
def test_smollm2_answers_in_the_schema(smollm2_gguf):
    """The real SmolLM2 file through its chat template: its reply parses and validates."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                               "age": {"type": "integer", "minimum": 0,
                                                       "maximum": 150},
                                               "city": {"type": "string", "maxLength": 40}},
              "required": ["name", "age", "city"], "additionalProperties": False}
    lm = causallm.load(smollm2_gguf)
    done = lm.complete([{"role": "user", "content": "Describe a person living in Paris as "
                                                    "JSON with name, age and city."}],
                       max_new_tokens=80, greedy=True, json_schema=schema)
    validate(json.loads(done.text), schema)
    assert done.finish_reason == "stop"


@pytest.mark.slow
@needs_llguidance
def test_gemma3_vocabulary_walks_a_json_text(gemma3_gguf):
    """Gemma 3's 262,144-token SentencePiece vocabulary: a pretty-printed value is allowed
    token by token."""
    tokenizer = Tokenizer(GGUFFile(gemma3_gguf).tokenizer())
    constraint, _ = walk(compile_json_schema(tokenizer, PERSON), tokenizer, TEXTS[1], 262144)
    assert constraint.done


# ----------------------------------------------------------------------- the CLI
@pytest.mark.slow
@needs_llguidance
def test_cli_json_schema_file_and_text(tmp_path, capsys):
    path = tmp_path / "person.json"
    path.write_text(json.dumps(PERSON))
    for given in (str(path), json.dumps(PERSON)):
        capsys.readouterr()
        rc = main.main([TINY, "Answer:", "--greedy", "-n", "150", "--json-schema", given,
                        "--json"])
        out = capsys.readouterr().out
        record = json.loads(out.rstrip("\n").rsplit("\n", 1)[1])
        assert rc == 0 and record["finish_reason"] == "stop"
        validate(json.loads(record["text"]))
    capsys.readouterr()
    assert main.main([TINY, "Answer:", "--greedy", "-n", "100", "--json-object"]) == 0
    assert isinstance(json.loads(capsys.readouterr().out), dict)


@pytest.mark.slow
@needs_llguidance
def test_cli_errors_name_the_flag_and_the_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "strin"}')
    broken = tmp_path / "broken.json"
    broken.write_text('{"type": ')
    cases = [
        ([str(bad)], f"error: --json-schema {bad}: Invalid type: strin"),
        ([str(broken)], f"error: --json-schema {broken}: not valid JSON"),
        ([str(tmp_path / "none.json")], "no such file"),
        (['{"type": "object"', "--json-object"], "--json-schema and --json-object do not go"),
        (['{"type": "object"}', "--num-beams", "2"], "does not go with 2 beams"),
    ]
    for args, message in cases:
        capsys.readouterr()
        rc = main.main([TINY, "Answer:", "--json-schema", *args])
        err = capsys.readouterr().err
        assert rc == 2 and message in err and err.count("\n") == 1, err
