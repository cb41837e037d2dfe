"""The CLI, mirroring Applications/CausalLM/main.cpp.

    python main.py [MODEL_DIR] [PROMPT] [options]

MODEL_DIR holds config.json (required), generation_config.json and nntr_config.json (both
optional) and the weights: nntr_config's ``model_file_name`` (an NNTrainer .bin, or a
.safetensors), else the folder's Hugging Face safetensors. Without MODEL_DIR the small model
embedded in res/tiny-llama runs. The generated text streams to stdout; the NNTrainer metrics
block goes to stderr; ``--json`` adds one JSON object as the last stdout line. A user error is
one line ``error: ...`` on stderr and exit status 2 (``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import orjson

import causallm  # noqa: F401  (first: it sizes the thread pools before numpy loads)

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODEL_DIR = os.path.join(HERE, "res", "tiny-llama")


def registerModels() -> None:
    """main.cpp's ``Factory::Instance().registerModel(...)`` calls."""
    from factory import Factory
    from models.causal_lm import CausalLM

    factory = Factory.Instance()
    factory.registerModel("LlamaForCausalLM", lambda cfg, gen, nntr: CausalLM(cfg, gen, nntr))
    from models.qwen3_cached_slim_moe.qwen3_cached_slim_moe_causallm import (
        Qwen3CachedSlimMoECausalLM)
    from models.qwen3_moe.qwen3_moe_causallm import Qwen3MoECausalLM
    from models.qwen3_slim_moe.qwen3_slim_moe_causallm import Qwen3SlimMoECausalLM
    factory.registerModel("Qwen3MoeForCausalLM",
                          lambda cfg, gen, nntr: Qwen3MoECausalLM(cfg, gen, nntr))
    factory.registerModel("Qwen3SlimMoeForCausalLM",
                          lambda cfg, gen, nntr: Qwen3SlimMoECausalLM(cfg, gen, nntr))
    factory.registerModel("Qwen3CachedSlimMoeForCausalLM",
                          lambda cfg, gen, nntr: Qwen3CachedSlimMoECausalLM(cfg, gen, nntr))
    from models.gemma3.gemma3_causallm import Gemma3CausalLM
    factory.registerModel("Gemma3ForCausalLM",
                          lambda cfg, gen, nntr: Gemma3CausalLM(cfg, gen, nntr))
    from models.gpt_oss.gptoss_causallm import GptOssForCausalLM
    from models.gpt_oss_cached_slim.gptoss_cached_slim_causallm import GptOssCachedSlimCausalLM
    factory.registerModel("GptOssForCausalLM",
                          lambda cfg, gen, nntr: GptOssForCausalLM(cfg, gen, nntr))
    factory.registerModel("GptOssCachedSlimCausalLM",
                          lambda cfg, gen, nntr: GptOssCachedSlimCausalLM(cfg, gen, nntr))
    from models.gpt2.gpt2_causallm import GPT2CausalLM
    factory.registerModel("GPT2LMHeadModel", lambda cfg, gen, nntr: GPT2CausalLM(cfg, gen, nntr))
    from models.qwen2.qwen2_causallm import Qwen2CausalLM
    from models.qwen3.qwen3_causallm import Qwen3CausalLM
    factory.registerModel("Qwen2ForCausalLM", lambda cfg, gen, nntr: Qwen2CausalLM(cfg, gen, nntr))
    factory.registerModel("Qwen3ForCausalLM", lambda cfg, gen, nntr: Qwen3CausalLM(cfg, gen, nntr))
    from models.bert.bert_model import BertEmbedding
    from models.gemma3.embedding_gemma import EmbeddingGemma
    from models.qwen2.qwen2_embedding import Qwen2Embedding
    from models.qwen3.qwen3_embedding import Qwen3Embedding
    factory.registerModel("Qwen3Embedding", lambda cfg, gen, nntr: Qwen3Embedding(cfg, gen, nntr))
    factory.registerModel("Qwen2Embedding", lambda cfg, gen, nntr: Qwen2Embedding(cfg, gen, nntr))
    factory.registerModel("EmbeddingGemma", lambda cfg, gen, nntr: EmbeddingGemma(cfg, gen, nntr))
    factory.registerModel("BertEmbedding", lambda cfg, gen, nntr: BertEmbedding(cfg, gen, nntr))


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line error (``error: ...``, exit status 2) instead of the
    usage block."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = _Parser(
        prog="causallm", description="Run an NNTrainer-style CausalLM on a model folder.",
        epilog="Sampling defaults come from generation_config.json; --temp/--top-k/--top-p "
               "switch sampling on (--temp 0 means greedy); --greedy forces greedy decoding.")
    p.add_argument("model_dir", nargs="?", default=DEFAULT_MODEL_DIR,
                   help="model folder (default: the embedded res/tiny-llama)")
    p.add_argument("prompt", nargs="?", default=None,
                   help="input text (default: nntr_config.json sample_input)")
    p.add_argument("-n", "--max-new-tokens", type=int, default=None,
                   help="new tokens to generate (nntr_config num_to_generate)")
    p.add_argument("--greedy", action="store_true", help="argmax decoding")
    p.add_argument("--temp", type=float, default=None, help="sampling temperature")
    p.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass")
    p.add_argument("--repeat-penalty", type=float, default=None,
                   help="repetition penalty (1.0: off)")
    p.add_argument("-s", "--seed", type=int, default=None, help="random seed for sampling")
    p.add_argument("-t", "--threads", type=int, default=None, help="kernel threads")
    p.add_argument("--system", default=None, help="system prompt placed before the prompt")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object with ids, text and metrics as the last line")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p.parse_args(argv)


def _check_args(args: argparse.Namespace) -> None:
    from causallm.errors import CausalLMError

    checks = [
        (args.max_new_tokens is not None and args.max_new_tokens < 1, "-n must be at least 1"),
        (args.temp is not None and not (math.isfinite(args.temp) and args.temp >= 0),
         "--temp must be a finite number >= 0"),
        (args.top_k is not None and args.top_k < 0, "--top-k must be >= 0"),
        (args.top_p is not None and not 0 < args.top_p <= 1, "--top-p must be in (0, 1]"),
        (args.repeat_penalty is not None
         and not (math.isfinite(args.repeat_penalty) and args.repeat_penalty > 0),
         "--repeat-penalty must be a finite number > 0"),
        (args.seed is not None and args.seed < 0, "--seed must be >= 0"),
        (args.threads is not None and args.threads < 1, "-t must be at least 1"),
    ]
    for bad, message in checks:
        if bad:
            raise CausalLMError(message)


def _short(path: str) -> str:
    """``path`` relative to the working directory when it lies below it, else absolute."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


EMBEDDING_ARCHITECTURES = {
    "Qwen3ForCausalLM": "Qwen3Embedding", "Qwen3Model": "Qwen3Embedding",
    "Gemma3ForCausalLM": "EmbeddingGemma", "Gemma3TextModel": "EmbeddingGemma",
    "Qwen2Model": "Qwen2Embedding", "Qwen2ForCausalLM": "Qwen2Embedding",
    "BertModel": "BertEmbedding",
}
"""main.cpp ``resolve_architecture`` for embedding models, plus Qwen3Model, Qwen2ForCausalLM and
BertModel."""


def resolve_architecture(cfg, nntr_cfg=None) -> str:
    """``config.json`` ``architectures[0]``, resolved as main.cpp does: with nntr_config
    ``model_type`` "embedding" it names the embedding class (an architecture without one is an
    error). Beyond main.cpp, a sentence-transformers folder (a ``modules.json`` beside
    config.json, or nntr_config's ``module_config_path``, and no ``model_type``) resolves the
    same way, and BertModel (an encoder) always does."""
    from causallm.errors import CausalLMError

    archs = cfg.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise CausalLMError(f"{cfg.path}: missing key 'architectures' (a list naming the model "
                            f"class, e.g. [\"LlamaForCausalLM\"])")
    architecture = archs[0]
    model_type = nntr_cfg.get_str("model_type").lower() \
        if nntr_cfg is not None and nntr_cfg.contains("model_type") else None
    if model_type == "embedding":
        if architecture not in EMBEDDING_ARCHITECTURES:
            raise CausalLMError(f"{cfg.path}: unsupported architecture for embedding model: "
                                f"{architecture} (supported: "
                                f"{', '.join(EMBEDDING_ARCHITECTURES)})")
        return EMBEDDING_ARCHITECTURES[architecture]
    modules = os.path.join(cfg.directory, "modules.json")
    if nntr_cfg is not None and nntr_cfg.contains("module_config_path"):
        modules = nntr_cfg.resolve_path(nntr_cfg.get_str("module_config_path"))
    if architecture in EMBEDDING_ARCHITECTURES and (
            architecture == "BertModel" or (model_type is None and os.path.isfile(modules))):
        return EMBEDDING_ARCHITECTURES[architecture]
    return architecture


def run_embedding(args: argparse.Namespace, model, architecture: str, prompt: str,
                  head_prompt: str, tail_prompt: str, nntr_cfg, t_start: float) -> int:
    """The embedding models' run (SentenceTransformer::run): print the embedding; with --json,
    one last line {"architecture", "prompt_ids", "embedding", "dim", ...}."""
    from causallm.errors import CausalLMError

    model.initialize()
    weight_path = (nntr_cfg.resolve_path(nntr_cfg.get_str("model_file_name"))
                   if nntr_cfg.contains("model_file_name") else args.model_dir)
    if not os.path.exists(weight_path):
        raise CausalLMError(f"{nntr_cfg.path}: model_file_name '{weight_path}' does not exist")
    model.load_weight(weight_path)
    embedding = model.run(prompt, False, head_prompt, tail_prompt, log_output=True)
    e2e_ms = (time.perf_counter() - t_start) * 1e3
    m = model.performance_metrics
    sys.stderr.write(f"encode: {m.prefill_tokens} tokens, {m.prefill_duration_ms:.0f} ms\n"
                     f"peak memory: {m.peak_memory_kb} KB\n[e2e time]: {e2e_ms:.0f} ms\n")
    if args.json:
        record = {"architecture": architecture, "model_dir": os.path.abspath(args.model_dir),
                  "prompt": prompt, "prompt_ids": model.prompt_ids,
                  "embedding": [float(v) for v in embedding[0]], "dim": int(embedding.shape[1]),
                  "encode_ms": round(m.prefill_duration_ms, 3), "total_ms": round(e2e_ms, 3),
                  "peak_memory_kb": m.peak_memory_kb}
        sys.stdout.write(orjson.dumps(record).decode() + "\n")
        sys.stdout.flush()
    return 0


def run(args: argparse.Namespace) -> int:
    from causallm.io.config import load_model_configs
    from causallm.errors import CausalLMError
    from factory import Factory
    from models.transformer import set_threads

    t_start = time.perf_counter()
    _check_args(args)
    if not os.path.isdir(args.model_dir):
        what = "a file, not a folder" if os.path.exists(args.model_dir) else "no such directory"
        hint = (f"; to prompt the default model, pass its folder first: "
                f"{_short(DEFAULT_MODEL_DIR)} \"PROMPT\""
                if args.prompt is None and not os.path.exists(args.model_dir) else "")
        raise CausalLMError(f"{args.model_dir}: not a model folder ({what}){hint}")
    cfg, gen_cfg, nntr_cfg = load_model_configs(args.model_dir)
    if args.max_new_tokens is not None:
        nntr_cfg["num_to_generate"] = args.max_new_tokens
    if args.threads is not None:
        set_threads(args.threads)

    head_prompt, tail_prompt = "", ""
    if nntr_cfg.contains("system_prompt"):
        system = nntr_cfg.get_dict("system_prompt")
        head_prompt = system.get_str("head_prompt", "")
        tail_prompt = system.get_str("tail_prompt", "")
    if args.system is not None:
        head_prompt = args.system

    registerModels()
    architecture = resolve_architecture(cfg, nntr_cfg)
    model = Factory.Instance().create(architecture, cfg, gen_cfg, nntr_cfg)
    if model is None:
        raise CausalLMError(f"{cfg.path}: unknown architecture '{architecture}' "
                            f"(architectures[0]); registered: "
                            f"{', '.join(Factory.Instance().getRegistered())}")

    prompt = args.prompt
    if prompt is None and nntr_cfg.contains("chat_input"):  # main.cpp step 6
        if architecture == "Gemma3ForCausalLM":
            from models.gemma3.function import function_gemma_prompt
            prompt = function_gemma_prompt(nntr_cfg.get_dict("chat_input"), model.tokenizer)
        else:
            sys.stderr.write(f"[Warning] 'chat_input' is set but support for model architecture "
                             f"'{architecture}' is not implemented. Falling back to "
                             f"'sample_input'.\n")
    if prompt is None:
        if not nntr_cfg.contains("sample_input"):
            raise CausalLMError(f"no prompt: pass one after the model folder or set "
                                f"'sample_input' in {nntr_cfg.path}")
        prompt = nntr_cfg.get_str("sample_input")

    from models.sentence_transformer import SentenceTransformer
    if isinstance(model, SentenceTransformer):
        return run_embedding(args, model, architecture, prompt, head_prompt, tail_prompt,
                             nntr_cfg, t_start)

    if args.temp is not None:
        model.TEMPERATURE = args.temp
    if args.top_k is not None:
        model.TOP_K = args.top_k
    if args.top_p is not None:
        model.TOP_P = args.top_p
    if args.repeat_penalty is not None:
        model.REPETITION_PENALTY = args.repeat_penalty
    if args.seed is not None:
        model.SEED = args.seed
    do_sample = model.DO_SAMPLE
    if args.temp is not None or args.top_k is not None or args.top_p is not None:
        do_sample = True
    if args.greedy:
        do_sample = False
    do_sample = model.samples(do_sample)  # temperature 0 (--temp 0 or the config's) is greedy

    model.initialize()
    weight_path = (nntr_cfg.resolve_path(nntr_cfg.get_str("model_file_name"))
                   if nntr_cfg.contains("model_file_name") else args.model_dir)
    if not os.path.exists(weight_path):
        raise CausalLMError(f"{nntr_cfg.path}: model_file_name '{weight_path}' does not exist")
    model.load_weight(weight_path)
    init_ms = (time.perf_counter() - t_start) * 1e3

    result = model.run(prompt, do_sample, head_prompt, tail_prompt, log_output=True)
    m = model.performance_metrics
    m.initialization_duration_ms = init_ms
    e2e_ms = (time.perf_counter() - t_start) * 1e3
    sys.stderr.write(f"[e2e time]: {e2e_ms:.0f} ms\n")

    if args.json:
        def rate(n, ms):
            return round(n / ms * 1000, 3) if ms > 0 else None

        record = {
            "architecture": architecture,
            "model_dir": os.path.abspath(args.model_dir),
            "prompt": prompt,
            "prompt_ids": result.prompt_ids[0],
            "generated_ids": result.generated_ids[0],
            "text": result.texts[0],
            "finish_reason": result.finish_reasons[0],
            "do_sample": do_sample,
            "prefill": {"tokens": m.prefill_tokens, "ms": round(m.prefill_duration_ms, 3),
                        "tps": rate(m.prefill_tokens, m.prefill_duration_ms)},
            "generation": {"tokens": m.generation_tokens,
                           "ms": round(m.generation_duration_ms, 3),
                           "tps": rate(m.generation_tokens, m.generation_duration_ms)},
            "initialization_ms": round(init_ms, 3),
            "total_ms": round(e2e_ms, 3),
            "peak_memory_kb": m.peak_memory_kb,
        }
        if len(result.generated_ids) > 1:
            record["batch"] = [{"generated_ids": g, "text": t, "finish_reason": r} for g, t, r in
                               zip(result.generated_ids, result.texts, result.finish_reasons)]
        sys.stdout.write(orjson.dumps(record).decode() + "\n")
        sys.stdout.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:  # a non-UTF-8 terminal shows '?' rather than failing mid-stream
        reconfigure(errors="replace")
    try:
        return run(args)
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        return 130
    except BrokenPipeError:  # stdout closed early (`| head`): stop quietly, as SIGPIPE would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as e:  # one line for the user; the traceback with --debug
        if args.debug:
            raise
        from causallm.errors import CausalLMError

        if isinstance(e, CausalLMError):
            sys.stderr.write(f"error: {e}\n")
            return 2
        sys.stderr.write(f"error: {type(e).__name__}: {e} (run with --debug for the traceback)\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
