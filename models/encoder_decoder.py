"""EncoderDecoder: an encoder run once per prompt and a decoder run step by step, reading the
encoder's output through cross-attention (NNTrainer's encoder-decoder note, fixed
where it is wrong: docs/nntrainer.md, "What the note plans", "Where the plan is wrong").

``constructModel`` builds one graph in two stages (causallm/runtime/compiler.py)::

    encoder   encoder_input0 -> encoder_embedding0 -> encoder_layer{i} blocks -> encoder_output_norm
              (+ every decoder layer's cross-attention K and V projections of encoder_output_norm)
    decoder   decoder_input0 -> decoder_embedding0 -> decoder_layer{i} blocks -> decoder_output_norm
              -> output_of_encoder_decoder (the LM head)

An encoder block (``createTransformerEncoderBlock``), x its input, names ``encoder_layer{i}_*``
as the note writes them::

    a = x + Attention_bidirectional(Norm(x))   _attention_norm, _wq.._attention_out, _encoder_add
    y = a + Mlp(Norm(a))                       _ffn_norm, _ffn_*, _encoder_output

A decoder block (``createTransformerDecoderBlock``), names ``decoder_layer{i}_*``::

    a = x + Attention_causal(Norm(x))          _self_attn_norm, _wq.._attention_out, _self_attn_add
    c = a + CrossAttention(Norm(a), enc)       _cross_attn_norm, _cross_wq (from the decoder),
                                               _cross_wk/_cross_wv (from encoder_output_norm),
                                               _cross_attention, _cross_attention_out,
                                               _cross_attn_add
    y = c + Mlp(Norm(c))                       _ffn_norm, _ffn_*, _decoder_output

The cross K and V projections read only the encoder, so the compiler puts them in the encoder
stage: they run once per prompt and their outputs are the decoder's cross-attention KV caches
(kind "cross"). The decoder embedding shares the encoder's weight, and a tied head shares it
too (``shared_from=encoder_embedding0``), as every Hugging Face encoder-decoder ties them.

The note's three phases, in Python::

    model.encode(ids)           encoder prefill: the encoder stage over the whole prompt, once;
                                returns encoder_output (B, L, D) and leaves the cross K/V
    model.decode(ids, 0)        decoder prefill with encoder_output (held by the model): logits
    model.decode(token, pos)    one-token decoder step with encoder_output: logits

``start`` (for the generator) encodes the prompt and prefills the decoder with
``decoder_start_token_id``; ``step`` is one ``decode``. Text in, text out: ``run`` (LanguageModel).

Config (beyond Transformer's): ``num_encoder_layers`` and ``num_decoder_layers`` (default
``num_hidden_layers``), ``decoder_start_token_id`` (generation_config.json, else config.json;
required). nntr_config ``init_seq_len`` is the longest prompt the encoder takes (in one step:
attention is bidirectional); the context (``max_seq_len``, ``-c``; Transformer.setupContext) is
the decoder's positions (its KV cache rows), which ``num_to_generate`` fits in.
"""

from __future__ import annotations

import numpy as np

from causallm.api import createLayer, createModel, registerFactory, withKey
from causallm.errors import CausalLMError
from causallm.generation.generator import PerformanceMetrics, Start
from causallm.io.config import JsonConfig
from causallm.runtime.properties import UINT_MAX
from causallm.layers.lm_head import LmHeadLayer
from causallm.models.language_model import LanguageModel
from causallm.models.transformer import CROSS_ATTENTION, ENCODER_ATTENTION, SELF_ATTENTION, ModelType

ENCODER, DECODER = "encoder", "decoder"
"""The stages."""


class EncoderDecoder(LanguageModel):
    """The encoder-decoder base (module docstring); T5 and the families after it subclass it."""

    MODEL_TYPE = ModelType.MODEL
    NORMALIZE_BEFORE = True
    """Pre-norm blocks, x + f(norm(x)), as the note draws them (T5); False: post-norm,
    norm(x + f(x)), as the paper and BART / Marian."""

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(cfg, generation_cfg, nntr_cfg)
        self.NUM_ENCODER_LAYERS = cfg.get_int("num_encoder_layers", self.NUM_LAYERS, minimum=1)
        self.NUM_DECODER_LAYERS = cfg.get_int("num_decoder_layers", self.NUM_LAYERS, minimum=1)
        key = "decoder_start_token_id"
        source = generation_cfg if generation_cfg.contains(key) else cfg
        if not source.contains(key):
            raise CausalLMError(f"{cfg.path}: missing key '{key}' (the token the decoder starts "
                                f"from; in generation_config.json or config.json)")
        self.DECODER_START_TOKEN_ID = source.get_int(key, minimum=0)
        if self.DECODER_START_TOKEN_ID >= self.NUM_VOCAB:
            raise source.error(key, f"a token id below vocab_size ({self.NUM_VOCAB})")
        self.MAX_POSITIONS = None  # a family with learned positions: its table's length
        self.position = 0  # decoder positions the self-attention caches hold (start, step)
        self.LM_HEAD_SCALE = 1.0  # the decoder output's scale before a tied head (T5's)
        # per stack (a family whose stacks differ sets them apart)
        self.ENCODER_NUM_HEADS = self.DECODER_NUM_HEADS = self.NUM_HEADS
        self.ENCODER_HEAD_DIM = self.DECODER_HEAD_DIM = self.HEAD_DIM
        self.ENCODER_INTERMEDIATE_SIZE = self.DECODER_INTERMEDIATE_SIZE = self.INTERMEDIATE_SIZE

    def positionLimit(self) -> int | None:
        """MAX_POSITIONS: no decoder step past a learned position table."""
        return self.MAX_POSITIONS

    def setupContext(self, nntr_cfg: JsonConfig) -> None:
        """The context is the decoder's: DECODER_SEQ_LEN positions, its self-attention KV cache
        rows, which the new tokens fit in; the encoder takes INIT_SEQ_LEN tokens in one step."""
        self.context = self.readContext(nntr_cfg)
        self.MAX_SEQ_LEN = self.DECODER_SEQ_LEN = self.context.length
        self.NUM_TO_GENERATE = self.context.fitNewTokens(self.NUM_TO_GENERATE)

    def kvBytesPerPosition(self) -> int:
        """The decoder's self-attention caches, one position of one sequence."""
        per = 2 if self.precision.kvCacheDtype() == "FP16" else 4
        return (2 * self.NUM_DECODER_LAYERS * self.DECODER_NUM_HEADS * self.DECODER_HEAD_DIM
                // self.GQA_SIZE * per)

    # -- graph ------------------------------------------------------------------------------
    def constructModel(self) -> None:
        layers = []
        self.model = createModel()

        # ========== ENCODER ==========
        layers.append(createLayer("input", [withKey("name", "encoder_input0"),
                                            withKey("input_shape", f"1:1:{self.INIT_SEQ_LEN}")]))
        stack, input_name = self.createStackInput(ENCODER, "encoder_input0")
        layers += stack
        layers += self.createPositionBias(ENCODER, "encoder_input0")
        for i in range(self.NUM_ENCODER_LAYERS):
            layers += self.createTransformerEncoderBlock(i, input_name)
            input_name = f"encoder_layer{i}_encoder_output"
        stack, encoder_output = self.createStackOutput(ENCODER, input_name)
        layers += stack

        # ========== DECODER ==========
        layers.append(createLayer("input", [withKey("name", "decoder_input0"),
                                            withKey("input_shape",
                                                    f"1:1:{self.DECODER_SEQ_LEN}")]))
        stack, input_name = self.createStackInput(DECODER, "decoder_input0")
        layers += stack
        layers += self.createPositionBias(DECODER, "decoder_input0")
        for i in range(self.NUM_DECODER_LAYERS):
            layers += self.createTransformerDecoderBlock(i, input_name, encoder_output)
            input_name = f"decoder_layer{i}_decoder_output"
        stack, decoder_output = self.createStackOutput(DECODER, input_name)
        layers += stack
        stack, logits = self.createHead(decoder_output)
        layers += stack

        for layer in layers:
            self.model.addLayer(layer)
        # the encoder runs each prompt once; the decoder runs rowsPerPrompt() rows of it (beams)
        self.model.addStage(ENCODER, self.encoderInputNames(), [encoder_output],
                            batch=self.BATCH_SIZE)
        self.model.addStage(DECODER, ["decoder_input0"], [logits])

    def createStackInput(self, stack: str, input_name: str) -> tuple[list, str]:
        """The layers from a stack's token ids to its first block's input, and that layer's name:
        here the token embedding, ``encoder_embedding0`` / ``decoder_embedding0`` (the decoder's
        shares the encoder's weight). Families add positions and an embedding norm."""
        name = f"{stack}_embedding0"
        shared = "encoder_embedding0" if stack == DECODER else None
        return [self.createEmbedding(name, input_name, shared_from=shared)], name

    def createEmbedding(self, name: str, input_name: str, shared_from: str | None = None):
        """A token embedding (``tie_word_embeddings`` when the head is tied, as in CausalLM)."""
        layer_type = "tie_word_embeddings" if self.TIE_WORD_EMBEDDINGS else "embedding_layer"
        props = [withKey("name", name), withKey("input_layers", input_name),
                 withKey("in_dim", self.NUM_VOCAB), withKey("out_dim", self.DIM),
                 withKey("weight_dtype", self.EMBEDDING_DTYPE),
                 withKey("scale", self.EMBEDDING_SCALE)]
        if shared_from:
            props.append(withKey("shared_from", shared_from))
        return createLayer(layer_type, props)

    def createStackOutput(self, stack: str, input_name: str) -> tuple[list, str]:
        """The stack's final norm, ``encoder_output_norm`` / ``decoder_output_norm``, and its
        name (a post-norm family's last block ends with a norm and adds none)."""
        if not self.NORMALIZE_BEFORE:
            return [], input_name
        name = f"{stack}_output_norm"
        return [self.createNorm(name, input_name)], name

    def createHead(self, input_name: str) -> tuple[list, str]:
        """The LM head ``output_of_encoder_decoder`` over ``input_name`` (tied to
        ``encoder_embedding0``, its input scaled by LM_HEAD_SCALE, or its own weight), and the
        name of the layer whose output is the logits."""
        head_type = "tie_word_embeddings" if self.TIE_WORD_EMBEDDINGS else "lm_head"
        head = [withKey("name", "output_of_encoder_decoder"), withKey("unit", self.NUM_VOCAB),
                withKey("disable_bias", "true"), withKey("input_layers", input_name),
                withKey("weight_dtype", self.LMHEAD_DTYPE)]
        if self.TIE_WORD_EMBEDDINGS:
            head += [withKey("shared_from", "encoder_embedding0"),
                     withKey("scale", self.LM_HEAD_SCALE)]
        return [createLayer(head_type, head)], "output_of_encoder_decoder"

    def createPositionBias(self, stack: str, input_name: str) -> list:
        """Layers computing a stack's attention position bias, read by every attention of that
        stack (``attentionBiasInput``): none here (T5 adds its relative position bias)."""
        return []

    def attentionBiasInput(self, kind: str) -> str | None:
        """The position bias layer an attention of ``kind`` adds to its scores, or None."""
        return None

    def createResidual(self, input_name: str, norm: str, add: str, sublayer,
                       out: str | None = None) -> tuple[list, str]:
        """One sublayer f with its residual and norm, named ``norm`` and ``add``: pre-norm
        (NORMALIZE_BEFORE, the note's blocks) ``add = x + f(norm(x))``, post-norm (the paper's)
        ``norm(add = x + f(x))``. ``sublayer(name)`` gives f's layers over ``name`` and the
        name of f's output; ``out`` renames the last layer (a block's output). Returns the
        layers and the name of the result."""
        if self.NORMALIZE_BEFORE:
            add = out or add
            body, f = sublayer(norm)
            return [self.createNorm(norm, input_name), *body,
                    self.createAddition(add, input_name, f)], add
        norm = out or norm
        body, f = sublayer(input_name)
        return [*body, self.createAddition(add, input_name, f),
                self.createNorm(norm, add)], norm

    def createTransformerEncoderBlock(self, layer_id: int, input_name: str) -> list:
        """Self-attention (bidirectional), then the MLP, each a residual sublayer
        (``createResidual``); the block's output is ``encoder_layer{i}_encoder_output``."""
        p = f"encoder_layer{layer_id}"
        heads, head_dim = self.ENCODER_NUM_HEADS, self.ENCODER_HEAD_DIM

        def attention(h):
            return self.createAttention(layer_id, self.INIT_SEQ_LEN, heads, head_dim, h, h, h,
                                        prefix=p, kind=ENCODER_ATTENTION), f"{p}_attention_out"

        def mlp(h):
            return self.createMlp(layer_id, self.DIM, self.ENCODER_INTERMEDIATE_SIZE, h,
                                  prefix=p), f"{p}_ffn_down"

        layers, x = self.createResidual(input_name, f"{p}_attention_norm", f"{p}_encoder_add",
                                        attention)
        ffn, _ = self.createResidual(x, f"{p}_ffn_norm", f"{p}_ffn_add", mlp,
                                     out=f"{p}_encoder_output")
        return layers + ffn

    def createTransformerDecoderBlock(self, layer_id: int, input_name: str,
                                      encoder_output_name: str = "encoder_output_norm") -> list:
        """Self-attention (causal), cross-attention (queries from the decoder, keys and values
        from ``encoder_output_name``), then the MLP, each a residual sublayer
        (``createResidual``); the block's output is ``decoder_layer{i}_decoder_output``."""
        p = f"decoder_layer{layer_id}"
        heads, head_dim = self.DECODER_NUM_HEADS, self.DECODER_HEAD_DIM
        T = self.DECODER_SEQ_LEN
        enc = encoder_output_name

        def attention(h):
            return self.createAttention(layer_id, T, heads, head_dim, h, h, h, prefix=p,
                                        kind=SELF_ATTENTION), f"{p}_attention_out"

        def cross_attention(h):
            return self.createAttention(layer_id, T, heads, head_dim, h, enc, enc,
                                        prefix=f"{p}_cross", kind=CROSS_ATTENTION), \
                f"{p}_cross_attention_out"

        def mlp(h):
            return self.createMlp(layer_id, self.DIM, self.DECODER_INTERMEDIATE_SIZE, h,
                                  prefix=p), f"{p}_ffn_down"

        layers, x = self.createResidual(input_name, f"{p}_self_attn_norm", f"{p}_self_attn_add",
                                        attention)
        cross, x = self.createResidual(x, f"{p}_cross_attn_norm", f"{p}_cross_attn_add",
                                       cross_attention)
        ffn, _ = self.createResidual(x, f"{p}_ffn_norm", f"{p}_ffn_add", mlp,
                                     out=f"{p}_decoder_output")
        return layers + cross + ffn

    @staticmethod
    def createAddition(name: str, a: str, b: str):
        """``addition`` ``name`` = a + b (a residual)."""
        return createLayer("addition", [withKey("name", name), withKey("input_layers", f"{a},{b}")])

    def createAttentionCore(self, name: str, layer_id: int, n_heads: int, input_layers: list,
                            kind: str = SELF_ATTENTION):
        """Transformer's attention core, plus the stack's position bias when it has one."""
        bias = self.attentionBiasInput(kind)
        return super().createAttentionCore(name, layer_id, n_heads,
                                           [*input_layers, bias] if bias else input_layers, kind)

    def attentionCoreProperties(self, layer_id: int, n_heads: int,
                                kind: str = SELF_ATTENTION) -> dict:
        """The encoder's self-attention is bidirectional over its INIT_SEQ_LEN positions; the
        decoder's is causal over DECODER_SEQ_LEN positions; its cross-attention reads the
        encoder's keys as they are (no RoPE, no mask, no window)."""
        props = super().attentionCoreProperties(layer_id, n_heads, kind)
        if kind == ENCODER_ATTENTION:
            props.update(max_timestep=self.INIT_SEQ_LEN, is_causal=False)
        elif kind == SELF_ATTENTION:
            props.update(max_timestep=self.DECODER_SEQ_LEN, is_causal=True)
        else:
            props = {k: v for k, v in props.items() if not k.startswith("rope_")}
            props.update(max_timestep=self.DECODER_SEQ_LEN, is_cross_attention=True,
                         use_rope=False, is_causal=False, sliding_window=UINT_MAX)
        props["max_new_tokens"] = self.NUM_TO_GENERATE
        return props

    def registerCustomLayers(self) -> None:
        super().registerCustomLayers()
        registerFactory(LmHeadLayer)

    # -- the three phases -------------------------------------------------------------------
    def encode(self, prompt_ids) -> np.ndarray:
        """Encoder prefill: the encoder stage over ``prompt_ids`` (B, L), in one step (its
        attention is bidirectional). Returns the encoder output (B, L, D); the decoder's
        cross-attention K and V are projected from it in the same pass."""
        ids = np.asarray(prompt_ids, dtype=np.float32)
        B, L = ids.shape
        if self.MAX_POSITIONS is not None and L > self.MAX_POSITIONS:
            raise CausalLMError(f"{self.cfg.path}: the prompt has {L} tokens but the model has "
                                f"max_position_embeddings = {self.MAX_POSITIONS} positions")
        if L > self.INIT_SEQ_LEN:
            raise CausalLMError(f"the prompt has {L} tokens but the encoder takes at most "
                                f"init_seq_len = {self.INIT_SEQ_LEN} (in one step); raise "
                                f"init_seq_len in nntr_config.json")
        out = self.model.incremental_inference(B, self.encoderInputs(ids), None, L, 0, L,
                                               stage=ENCODER)[0]
        return out.reshape(B, -1, self.DIM)[:, :L]

    def encoderInputNames(self) -> list[str]:
        """The encoder stage's input layers, in the order encoderInputs gives their data."""
        return ["encoder_input0"]

    def encoderInputs(self, ids: np.ndarray) -> list:
        """The encoder stage's inputs for the prompts ``ids`` (B, L): the ids (a family with
        more input layers adds theirs)."""
        return [ids]

    def decode(self, ids, from_: int) -> np.ndarray:
        """A decoder step: ``ids`` (B, n) at positions ``[from_, from_ + n)``, attending to its
        cached positions and to the last encoded prompt. The logits of the last position
        (B, vocab)."""
        ids = np.asarray(ids, dtype=np.float32)
        B, n = ids.shape
        if from_ + n > self.DECODER_SEQ_LEN:
            raise CausalLMError(f"decoder position {from_ + n} is past its "
                                f"{self.DECODER_SEQ_LEN} positions ({self.context.source()})")
        return self.model.incremental_inference(B, [ids], None, n, from_, from_ + n,
                                                stage=DECODER)[0]

    # -- what the generator drives ----------------------------------------------------------
    def start(self, prompt_ids: np.ndarray, start_pos: int, context_ids: list[int],
              metrics: PerformanceMetrics) -> Start:
        """Encode the prompt, then prefill the decoder with ``decoder_start_token_id``."""
        if start_pos:
            raise CausalLMError(f"{type(self).__name__}: the prompt goes through the encoder; "
                                f"it cannot continue a cached system prompt")
        P = prompt_ids.shape[1]
        with metrics.phase("encode", P):
            self.encode(prompt_ids)
        rows = self.BATCH_SIZE * self.rowsPerPrompt()  # the beams share their prompt's encoding
        start = np.full((rows, 1), self.DECODER_START_TOKEN_ID, dtype=np.float32)
        with metrics.phase("prefill", 1):
            logits = self.decode(start, 0)
        self.position = 1
        return Start(logits, [[self.DECODER_START_TOKEN_ID] for _ in range(rows)],
                     self.DECODER_SEQ_LEN)

    def cacheLimit(self) -> str:
        """Why a generation ended with the decoder's cache full (finish reason ``cache_full``):
        the context (its learned positions, or -c) ends before num_to_generate."""
        return f"the decoder has {self.DECODER_SEQ_LEN} positions ({self.context.source()})"

    def step(self, tokens: np.ndarray) -> np.ndarray:
        """One decoder step: one token per row at the next decoder position."""
        logits = self.decode(tokens.reshape(-1, 1), self.position)
        self.position += 1
        return logits

    def reorder(self, rows) -> None:
        """Beam search: row r continues the decoder sequence of row ``rows[r]`` (its
        self-attention caches; the cross-attention caches are the prompt's, shared)."""
        for cache in self.model.getKVCaches("self", stage=DECODER):
            cache.reorder(rows, self.position)
