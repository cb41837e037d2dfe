"""One rule per generation option, the same on every surface (causallm/generation/options.py):
a bad value is refused by the CLI under its flag, by load() / complete() under its keyword and
by generation_config.json under its key, each message saying the same thing is expected. (The
server's fields: tests/test_server.py.)"""

import os

import orjson
import pytest

import causallm
from causallm import main
from causallm.errors import CausalLMError
from causallm.generation.options import OPTIONS
from causallm.loader import create

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "res", "tiny-llama")

BAD = {
    "max_new_tokens": ("0", 0), "temperature": ("-1", -1), "top_k": ("-1", -1),
    "top_p": ("2", 2), "min_p": ("1.5", 1.5), "typical_p": ("0", 0),
    "repetition_penalty": ("0", 0), "presence_penalty": ("nan", float("nan")),
    "frequency_penalty": ("inf", float("inf")), "no_repeat_ngram_size": ("-1", -1),
    "min_new_tokens": ("-2", -2), "seed": ("-1", -1), "stop": ("", ""),
    "num_beams": ("0", 0), "num_return_sequences": ("0", 0),
}
"""A bad value of each option with a value flag: as typed on the command line, as a keyword."""


def folder_with(tmp_path, **generation):
    """tiny-llama with ``generation`` over its generation_config.json."""
    folder = tmp_path / "model"
    folder.mkdir()
    for entry in os.listdir(TINY):
        os.symlink(os.path.join(TINY, entry), folder / entry)
    gen = orjson.loads(open(os.path.join(TINY, "generation_config.json"), "rb").read())
    os.unlink(folder / "generation_config.json")
    (folder / "generation_config.json").write_bytes(orjson.dumps({**gen, **generation}))
    return str(folder)


@pytest.fixture(scope="module")
def tiny():
    return causallm.load(TINY)


def test_every_option_with_a_value_flag_has_a_bad_case():
    assert set(BAD) == {n for n, o in OPTIONS.items()
                        if o.flag and n not in ("greedy", "json_schema", "response_format")}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_is_refused_alike_by_the_cli_and_the_api(name, tiny, capsys):
    option = OPTIONS[name]
    typed, value = BAD[name]
    assert main.main([TINY, "hi", f"{option.flag}={typed}"]) == 2
    assert capsys.readouterr().err.startswith(
        f"error: {option.flag} must be {option.expected}, got ")
    for call in (lambda: tiny.complete("hi", **{name: value}),
                 lambda: create(TINY, **{name: value})):
        with pytest.raises(CausalLMError) as e:
            call()
        assert str(e.value).startswith(f"{name} must be {option.expected}, got ")


@pytest.mark.parametrize("key, value, name", [
    ("temperature", -0.5, "temperature"), ("top_p", 1.5, "top_p"), ("top_k", -3, "top_k"),
    ("stop_strings", [""], "stop"), ("num_beams", 0, "num_beams"),
    ("bad_words_ids", [[]], "bad_words_ids"),
])
def test_generation_config_values_follow_the_same_rules(tmp_path, key, value, name):
    with pytest.raises(CausalLMError) as e:
        create(folder_with(tmp_path, **{key: value}))
    assert f"generation_config.json: '{key}' must be {OPTIONS[name].expected}, got " in \
        str(e.value)


def test_long_names_of_the_cli_are_the_api_names(capsys):
    """--temperature and --repetition-penalty are --temp's and --repeat-penalty's long names
    (the API's keywords); -n's is --max-new-tokens."""
    args = main.parse_args([TINY, "hi", "--temperature", "0.5", "--repetition-penalty", "1.2",
                            "--max-new-tokens", "3"])
    assert (args.temperature, args.repetition_penalty, args.max_new_tokens) == (0.5, 1.2, 3)


def test_the_commands_declare_their_shared_options_once():
    """main.py's OPTIONS table is the one declaration of every flag: serve and warmup take the
    shared ones from it (warmup's --dtype choices included), and --dtype's choices are the
    weight formats the loader knows."""
    from causallm.io.weights import WEIGHT_FORMATS
    from causallm.warmup import main as warmup

    assert tuple(main.WEIGHT_FORMATS) == WEIGHT_FORMATS
    serve = main.parse_serve_args(["m", "-n", "5", "-c", "64", "-t", "1", "--dtype", "q8_0"])
    run = main.parse_args(["m", "p", "-n", "5", "-c", "64", "-t", "1", "--dtype", "q8_0"])
    for name in ("max_new_tokens", "ctx_size", "threads", "dtype", "kv_dtype", "plugin", "debug"):
        assert getattr(serve, name) == getattr(run, name)
    with pytest.raises(SystemExit) as e:
        warmup(["--dtype", "Q9"])
    assert e.value.code == 2


def test_the_same_mistake_reads_the_same_from_the_cli_and_the_api(capsys):
    """Beyond the generation options: a context or thread count below 1, and new tokens beyond
    the context, are worded alike under the flag and the keyword (the server's max_tokens:
    tests/test_server.py)."""
    cases = [(["-c", "0"], dict(ctx_size=0), "must be an integer >= 1, got 0"),
             (["-t", "0"], dict(threads=0), "must be an integer >= 1, got 0"),
             (["-n", "100000"], dict(max_new_tokens=100000),
              "100000 is more than the context: ")]
    for argv, options, said in cases:
        assert main.main([TINY, "hi", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {argv[0]} ") and said in err, err
        with pytest.raises(CausalLMError) as e:
            create(TINY, **options)
        assert str(e.value).startswith(f"{next(iter(options))} ") and said in str(e.value)


CONFIG_BAD = {name: value for name, (_, value) in BAD.items()} | {"bad_words_ids": [[]]}
"""A bad value of each option generation_config.json may hold (under its settings field)."""


@pytest.mark.parametrize("name", sorted(n for n, o in OPTIONS.items() if o.config))
def test_every_config_option_is_read_and_checked_from_generation_config(tmp_path, name):
    """What the table says of an option is what happens: a config option is read from
    generation_config.json under its settings field (an applied key), a bad value named there;
    its settings field exists."""
    from dataclasses import fields

    from causallm.generation.settings import APPLIED_GENERATION_KEYS, GenerationSettings

    key = OPTIONS[name].setting
    assert key in {f.name for f in fields(GenerationSettings)} and key in APPLIED_GENERATION_KEYS
    with pytest.raises(CausalLMError) as e:
        create(folder_with(tmp_path, **{key: CONFIG_BAD[name]}))
    assert f"generation_config.json: '{key}' must be {OPTIONS[name].expected}, got " in \
        str(e.value)


def test_the_cli_takes_every_flag_of_the_table_under_its_keyword():
    """main.py declares no generation flag of its own: each option's flag and other spellings
    parse to its keyword."""
    typed = {"--greedy": [], "--json-object": [], "--stop": ["x"], "--json-schema": ["{}"]}
    for name, option in OPTIONS.items():
        if option.flag is None:
            continue
        for flag in (option.flag, *option.aliases):
            args = main.parse_args([TINY, "hi", flag, *typed.get(option.flag, ["3"])])
            assert getattr(args, name) not in (None, False), (name, flag)


def test_the_server_reads_every_field_of_the_table(tiny):
    """The server reads each option's request field by the option's rule (a 400 naming the
    field), and an absent field leaves the model's value."""
    server = pytest.importorskip("causallm.server")

    for name, option in OPTIONS.items():
        if option.field is None or name == "response_format":  # its compiler's (test_constraint)
            continue
        with pytest.raises(server.BadRequest) as e:
            server.request_settings({option.field: {"bad": 1}}, tiny)
        assert e.value.param == option.field
        assert str(e.value).startswith(f"'{option.field}' must be {option.expected}, got ")
    settings, given = server.request_settings({"temperature": 0.5, "max_tokens": 3}, tiny)
    assert (settings.temperature, settings.max_new_tokens, settings.do_sample) == (0.5, 3, True)
    assert settings.top_k == tiny.model.generation.top_k and given == {
        "temperature": 0.5, "max_new_tokens": 3}


@pytest.fixture
def counted(monkeypatch):
    """The values temperature's rule is asked about, as a list (the rule unchanged)."""
    from dataclasses import replace

    seen = []
    option = OPTIONS["temperature"]

    def valid(value):
        seen.append(value)
        return option.valid(value)
    monkeypatch.setitem(OPTIONS, "temperature", replace(option, valid=valid))
    return seen


@pytest.mark.slow
def test_a_value_is_checked_once_on_every_surface(tmp_path, counted, capsys):
    """A temperature given on the command line, to load(), to a call or in a request is asked
    of its rule once, where it comes in (then only combined: settings.withOptions); one in
    generation_config.json once as the model is made."""
    server = pytest.importorskip("causallm.server")

    assert main.main([TINY, "hi", "-n", "1", "--temp", "0.25"]) == 0
    loaded = causallm.load(folder_with(tmp_path, temperature=0.75), temperature=0.5,
                           max_new_tokens=1)
    loaded.complete("hi", temperature=0.125)
    settings, _ = server.request_settings({"temperature": 0.0625, "max_tokens": 1}, loaded)
    loaded.complete("hi", settings=settings)
    loaded.request("hi", settings=settings)
    assert sorted(v for v in counted if v in (0.25, 0.75, 0.5, 0.125, 0.0625)) == \
        [0.0625, 0.125, 0.25, 0.5, 0.75]
    assert loaded.model.generation.temperature == 0.5  # the calls changed nothing of the model


def test_settings_follow_the_precedence_and_a_call_changes_nothing(tmp_path):
    """generation_config.json, then load()'s options, then a call's: each over the one before,
    the model's settings untouched by the call."""
    loaded = causallm.load(folder_with(tmp_path, temperature=0.75, top_k=7, top_p=0.5),
                           temperature=0.5, top_k=3)
    model = loaded.model.generation
    assert (model.temperature, model.top_k, model.top_p) == (0.5, 3, 0.5)
    done = loaded.complete("hi", max_new_tokens=2, top_k=2, seed=1)
    assert done.result.do_sample is True
    assert loaded.model.generation is model and model.seed is None


def test_options_that_do_not_go_together_are_named_as_their_surface_spells_them(tiny, capsys):
    """More sequences than beams, and more beams than the vocabulary: under the flags on the
    command line, under the keywords in the API."""
    vocab = tiny.model.NUM_VOCAB
    cases = [(["--num-beams", "2", "--num-return-sequences", "3"],
              dict(num_beams=2, num_return_sequences=3),
              ("--num-return-sequences 3 exceeds --num-beams 2",
               "num_return_sequences 3 exceeds num_beams 2")),
             (["--num-beams", str(vocab + 1)], dict(num_beams=vocab + 1),
              (f"--num-beams must be at most the vocabulary size ({vocab}), got {vocab + 1}",
               f"num_beams must be at most the vocabulary size ({vocab}), got {vocab + 1}"))]
    for argv, options, (flag_said, keyword_said) in cases:
        assert main.main([TINY, "hi", "-n", "2", *argv]) == 2
        assert capsys.readouterr().err == f"error: {flag_said}\n"
        for call in (lambda: tiny.complete("hi", **options), lambda: create(TINY, **options)):
            with pytest.raises(CausalLMError) as e:
                call()
            assert str(e.value) == keyword_said
