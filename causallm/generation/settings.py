"""A generation's settings: one frozen GenerationSettings, built once, each value checked once.

Where the values come from, each step over the one before, each a copy:

    generation_config.json (else config.json), nntr_config.json   GenerationSettings.fromConfigs
      the CLI's flags, or causallm.load()'s options               .withOptions  -> the model's
        a call's options (generate, complete, ...), a request's   .withOptions  -> the call's
          what the call runs (temperature 0 is greedy, ...)        .resolved(do_sample)

The model is given its settings (``LanguageModel.setGenerationSettings``: the default of its
every generation); a call's settings go with the call (``generate_tokens(settings=)``, a
scheduler ``Request``), so nothing a call asks for changes the model.

Each option value is checked once, where it comes in, by its option's rule
(``options.Options.check``, the error naming the value as that surface spells it: flag,
keyword or request field); a config value as ``fromConfigs`` reads it (the error naming the file
and the key). ``withOptions`` checks only what a value means beside the others and the model's
vocabulary: token ids below ``vocab_size``, a response format compiled against the tokenizer,
a format with beams or forced tokens. What the model's graph was built for (its beams) is the
model's check.

Adding a generation option: a row in ``options.OPTIONS`` (its keyword, flag, field, rule, the
field it sets, whether generation_config.json has it, whether it switches sampling on), the
field here, and its use where tokens are chosen (``processors.build_processors`` or
``sampler.Sampler.fromSettings``). The CLI's flag, the server's field, ``load()``,
``complete()`` and the configs all read the table (docs/architecture.md, "Generation").
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Mapping

from causallm.errors import CausalLMError
from causallm.generation.options import OPTIONS, check_config
from causallm.io.config import JsonConfig

GENERATION_DEFAULTS = {"do_sample": False, "temperature": 0.7, "top_k": 20, "top_p": 0.95,
                       "repetition_penalty": 1.0}
"""NNTrainer's defaults of the generation_config.json keys CausalLM::setupParameters (and
main.cpp's do_sample) reads; they are read from generation_config.json alone."""

MODEL_KEYS = ("eos_token_id", "bos_token_id", "decoder_start_token_id", "max_new_tokens")
"""generation_config.json keys the model reads: its EOS ids (here too), BOS id, an
encoder-decoder's start token, and the default number of new tokens (NUM_TO_GENERATE, unless
nntr_config.json sets num_to_generate)."""

SEARCH_KEYS = ("do_sample", "length_penalty", "early_stopping", "min_length",
               "forced_bos_token_id", "forced_eos_token_id", "renormalize_logits", "max_length")
"""generation_config.json keys ``fromConfigs`` reads that no option sets."""

APPLIED_GENERATION_KEYS = frozenset((*MODEL_KEYS, *SEARCH_KEYS,
                                     *(o.setting for o in OPTIONS.values() if o.config)))
"""The generation_config.json keys generation applies (the one list: docs/cli.md shows it)."""

METADATA_GENERATION_KEYS = frozenset((
    "transformers_version", "_from_model_config", "pad_token_id", "use_cache",
    "cache_implementation", "return_dict_in_generate", "output_scores", "output_logits",
    "output_attentions", "output_hidden_states"))
"""generation_config.json keys that do not change the tokens chosen: no warning."""


def unappliedKeyWarnings(generation_cfg: JsonConfig) -> list[str]:
    """One warning line per generation_config.json key that is neither applied nor metadata."""
    return [f"warning: {generation_cfg.name}: '{key}' is not applied\n" for key in generation_cfg
            if key not in APPLIED_GENERATION_KEYS and key not in METADATA_GENERATION_KEYS]


@dataclass(frozen=True)
class GenerationSettings:
    """What a generation is asked to do (generation_config.json's keys, transformers' meaning;
    the module docstring says how they are built). Frozen: every step makes a copy."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0                                   # 0 = off
    typical_p: float = 1.0                               # 1 = off
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0                        # OpenAI / llama.cpp, 0 = off
    frequency_penalty: float = 0.0                       # OpenAI / llama.cpp, 0 = off
    stop_strings: list = field(default_factory=list)     # [str, ...]: a row ends on any
    bad_words_ids: list = field(default_factory=list)    # [[id, ...], ...]
    banned_token_ids: list = field(default_factory=list)  # nntr_config's bad_word_ids: never
                                                         # chosen, whatever bad_words_ids say
    no_repeat_ngram_size: int = 0
    min_length: int = 0
    min_new_tokens: int = 0
    forced_bos_token_id: int | None = None
    forced_eos_token_id: list = field(default_factory=list)
    eos_token_id: list = field(default_factory=list)
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    num_return_sequences: int = 1
    renormalize_logits: bool = False
    seed: int | None = None
    max_new_tokens: int | None = None  # a call's number of new tokens; None: the model's
                                       # (NUM_TO_GENERATE: nntr_config num_to_generate, ...)
    max_length: int | None = None      # prompt + new tokens at most (transformers' max_length,
                                       # given when nothing sets the new tokens' number)
    response_format: object = None     # a compiled ResponseFormat (generation/constraint.py):
                                       # each row held to its JSON grammar; None = free text
    vocab_size: int | None = None      # the model's (config.json's vocab_size): token ids
                                       # given as options are below it

    @classmethod
    def fromConfigs(cls, cfg: JsonConfig, generation_cfg: JsonConfig, nntr_cfg: JsonConfig,
                    vocab_size: int) -> "GenerationSettings":
        """The settings of a generation that sets nothing: CausalLM::setupParameters' keys
        (the EOS ids, nntr_config's bad_word_ids, and the sampling keys of
        generation_config.json with NNTrainer's defaults for the missing ones:
        GENERATION_DEFAULTS), and the keys transformers' generate() reads beyond them, from
        generation_config.json or from config.json when the folder has none
        (GenerationConfig's from_model_config): beyond the C++, which decodes one row greedily
        or by sampling. An option's value is checked by its rule (options.py), the others as
        read here, a bad one naming the file and key."""
        V = vocab_size
        banned = nntr_cfg.get_int_list("bad_word_ids", [])
        if any(not 0 <= t < V for t in banned):
            raise nntr_cfg.error("bad_word_ids", f"token ids in [0, {V})")
        if generation_cfg.contains("eos_token_id") and generation_cfg["eos_token_id"] != []:
            eos = generation_cfg.get_int_list("eos_token_id")
        else:  # an empty list falls back, as in the C++
            eos = cfg.get_int_list("eos_token_id", [])
        src = generation_cfg if generation_cfg.exists else cfg
        values = {}
        for option in OPTIONS.values():
            if not option.config:
                continue
            key = option.setting  # NNTrainer's keys from generation_config.json alone
            default = GENERATION_DEFAULTS.get(key, _default(key))
            value = check_config(generation_cfg if key in GENERATION_DEFAULTS else src,
                                 option.name, default)
            values[key] = float(value) if isinstance(default, float) else value
        if values["num_beams"] > V:
            raise src.error("num_beams", f"at most vocab_size ({V})")
        if any(t >= V for w in values["bad_words_ids"] for t in w):
            raise src.error("bad_words_ids", f"a list of non-empty lists of token ids in "
                                             f"[0, {V})")
        early = src.get("early_stopping", False)
        if early not in (True, False, "never"):
            raise src.error("early_stopping", "true, false or \"never\"")
        forced_bos = src.get_int("forced_bos_token_id", -1, minimum=0) \
            if src.contains("forced_bos_token_id") else None
        forced_eos = src.get_int_list("forced_eos_token_id", [])
        for key, value in (("forced_bos_token_id", [forced_bos] if forced_bos is not None else []),
                           ("forced_eos_token_id", forced_eos)):
            if any(t >= V for t in value):
                raise src.error(key, f"a token id below vocab_size ({V})")
        # max_length (prompt and new tokens together; an encoder-decoder's decoder tokens, its
        # start token included) caps the new tokens as in transformers, where it binds: when
        # nothing sets their number (nntr_config num_to_generate, -n, generation_config's
        # max_new_tokens, a call's max_new_tokens), which transformers' max_new_tokens overrides
        max_length = None
        if generation_cfg.get("max_length") is not None and not (
                nntr_cfg.contains("num_to_generate") or generation_cfg.contains("max_new_tokens")):
            max_length = generation_cfg.get_int("max_length", minimum=1)
        return cls(
            **values, do_sample=generation_cfg.get_bool("do_sample",
                                                        GENERATION_DEFAULTS["do_sample"]),
            banned_token_ids=banned, eos_token_id=eos,
            min_length=src.get_int("min_length", 0, minimum=0),
            forced_bos_token_id=forced_bos, forced_eos_token_id=forced_eos,
            length_penalty=src.get_float("length_penalty", 1.0), early_stopping=early,
            renormalize_logits=src.get_bool("renormalize_logits", False),
            max_length=max_length, vocab_size=V)

    def withOptions(self, options: Mapping, tokenizer=None) -> "GenerationSettings":
        """These settings with generation ``options`` over them, a copy. ``options`` (option
        name -> value) are checked already, where they came in (``Options.check``); a value
        replaces the settings' (``bad_words_ids`` and ``stop`` the configs' ones too). A
        temperature, top-k, top-p, min-p or typical-p switches sampling on (``sampling`` in
        the table); ``greedy`` means one beam, argmax; ``max_new_tokens``, the caller's number
        of new tokens, overrides ``max_length`` (as transformers'). ``response_format``
        (OpenAI's: ``{"type": "json_object"}``, ``{"type": "json_schema", "json_schema":
        {"name", "schema", "strict"}}`` or ``{"type": "text"}``) or ``json_schema`` (a JSON
        Schema object) holds the answer to JSON (causallm/generation/constraint.py), compiled
        here against ``tokenizer`` so a bad one fails before anything runs; one beam only."""
        V = self.vocab_size
        source = getattr(options, "source", "keyword")
        options = dict(options)
        words = options.get("bad_words_ids")
        if words is not None and V is not None and any(t >= V for w in words for t in w):
            raise CausalLMError(f"bad_words_ids must be token ids below the vocabulary size "
                                f"({V})")
        response_format = options.pop("response_format", None)
        json_schema = options.pop("json_schema", None)
        greedy = options.pop("greedy", False)
        num_beams = options.get("num_beams")
        if num_beams is not None and V is not None and num_beams > V:
            raise CausalLMError(f"{OPTIONS['num_beams'].called(source)} must be at most the "
                                f"vocabulary size ({V}), got {num_beams}")
        if response_format is not None and json_schema is not None:
            raise CausalLMError("give response_format or json_schema, not both")
        changes = {OPTIONS[name].setting: value for name, value in options.items()}
        if "max_new_tokens" in options:
            changes["max_length"] = None
        if response_format is not None or json_schema is not None:
            from causallm.generation.constraint import (
                compile_json_schema, compile_response_format)

            changes["response_format"] = (
                compile_response_format(tokenizer, response_format)
                if response_format is not None else compile_json_schema(tokenizer, json_schema))
        if any(OPTIONS[name].sampling for name in options):
            changes["do_sample"] = True
        if greedy:
            changes.update(do_sample=False, num_beams=1)
            changes.setdefault("num_return_sequences", 1)
        s = replace(self, **changes)
        if s.response_format is not None and s.num_beams > 1:
            raise CausalLMError(f"a response format (JSON schema or JSON object) holds one "
                                f"sequence to its grammar: it does not go with {s.num_beams} "
                                f"beams (use num_beams 1)")
        if s.response_format is not None and (s.forced_bos_token_id is not None
                                              or s.forced_eos_token_id):
            raise CausalLMError("a response format (JSON schema or JSON object) does not go with "
                                "the generation config's forced_bos_token_id / "
                                "forced_eos_token_id: the tokens they force are not JSON")
        return s

    def withEosTokenIds(self, ids) -> "GenerationSettings":
        """These settings also ending a row at each of ``ids`` (a chat template's end-of-turn
        tokens), a copy."""
        return replace(self, eos_token_id=list(dict.fromkeys([*self.eos_token_id,
                                                              *map(int, ids)])))

    def resolved(self, do_sample: bool | None = None) -> "GenerationSettings":
        """What a generation runs (the generator, the beam search, a scheduler Request): these
        settings sampling only when ``do_sample`` (default theirs) and the temperature is not
        0 (the limit of softmax(x / T) as T -> 0, and what ``--temp 0`` means). Sampling with
        beams, and more sequences returned than beams, are errors."""
        do_sample = bool(self.do_sample if do_sample is None else do_sample) \
            and self.temperature != 0
        if do_sample and self.num_beams > 1:
            raise CausalLMError(f"sampling with {self.num_beams} beams (beam sampling) is not "
                                f"supported: sample with one beam (--num-beams 1) or search "
                                f"the beams without sampling")
        if self.num_return_sequences > self.num_beams:
            raise CausalLMError(f"num_return_sequences {self.num_return_sequences} exceeds "
                                f"num_beams {self.num_beams}")
        return replace(self, do_sample=do_sample)


def _default(name: str):
    """The default of GenerationSettings field ``name``."""
    f = next(f for f in fields(GenerationSettings) if f.name == name)
    return f.default_factory() if f.default is MISSING else f.default
