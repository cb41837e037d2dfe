"""Beam search with transformers' semantics (``GenerationMixin._beam_search``), for any model.

The model runs K = num_beams rows per prompt (its graph is built with B x K rows) and gives
the search ``start``, ``step`` and ``reorder(rows)`` (row r takes the self-attention caches of
row ``rows[r]``; an encoder-decoder's K rows share their prompt's encoder output). Per prompt,
with P the length of each row's ids at the start (the decoder prompt: the prompt itself for a
decoder-only model, [decoder_start_token_id] for an encoder-decoder), and cur_len the length of
the ids so far, each step does, in float32 as transformers:

1. ``logp = log_softmax(logits)``, the processors (causallm/generation/processors.py) applied
   to each row's logp with its ids, plus the beam's running score (at the start 0 for beam 0
   and -1e9 for the others, so the first step expands one beam);
2. the ``keep = max(2, 1 + n_eos) * K`` best of the K x V candidates (beam, token) by score,
   highest first, ties to the lower index;
3. a candidate "hits" when its token is an EOS id or cur_len + 1 reaches max_length
   (P + max_new_tokens);
4. the K best candidates that do not hit (a hit gets -1e9) are the running beams of the next
   step; their caches are reordered from the beams they extend;
5. the candidates among the first K that hit are finished hypotheses, scored
   ``score / (cur_len + 1 - P) ** length_penalty``; they join the K best finished so far
   (unless the prompt's K finished are complete and ``early_stopping`` is true, or the
   heuristic below says no improvement is possible), the K best kept;
6. the prompt can still improve while the best running score divided by
   ``(L - P) ** length_penalty`` beats the worst finished score, L = max_length for
   ``early_stopping="never"`` with a positive length penalty, else the new cur_len;
   the search stops when no prompt can improve, or (``early_stopping`` true) every prompt has
   K finished, or every candidate hit.

The result per prompt is its ``num_return_sequences`` best finished hypotheses with their
scores (the new tokens, an EOS that ended one included). Stop strings do not steer the search:
each returned hypothesis's text is cut before the first stop string in it (its ids and score
stay those of the whole hypothesis), and the best one's finish_reason is then "stop". Greedy
decoding is one beam, argmax, and goes through causallm/generation/generator.py instead.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from causallm.errors import CausalLMError
from causallm.generation.generator import (
    GenerationResult,
    PerformanceMetrics,
    check_prompts,
    cut_at_stop,
    new_token_limit,
    peak_memory_kb,
)
from causallm.generation.processors import build_processors, log_softmax
from causallm.generation.settings import GenerationSettings

F32 = np.float32
PENALTY = F32(-1.0e9)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest of ``scores`` (1-D), largest first, ties to the lower index."""
    n = scores.size
    if k >= n:
        return np.lexsort((np.arange(n), -scores))
    kth = np.partition(scores, n - k)[n - k]
    above = np.flatnonzero(scores > kth)
    equal = np.flatnonzero(scores == kth)[:k - above.size]
    chosen = np.concatenate([above, equal])
    return chosen[np.lexsort((chosen, -scores[chosen]))]


class BeamSearch:
    """Beam search over ``model`` as ``settings`` say (module docstring)."""

    def __init__(self, model, settings: GenerationSettings, tokenizer=None, stream=None) -> None:
        self.model = model
        self.settings = settings
        self.tokenizer = tokenizer
        self.stream = stream

    def generate(self, prompt_ids: list[list[int]], max_new_tokens: int, start_pos: int = 0,
                 context_ids: Sequence[int] = (),
                 on_token: Callable[[int, int], None] | None = None) -> GenerationResult:
        s = self.settings
        K = s.num_beams
        B = self.model.BATCH_SIZE
        check_prompts(prompt_ids, B, max_new_tokens)
        if self.model.rowsPerPrompt() != K:
            raise CausalLMError(f"the model was built for {self.model.rowsPerPrompt()} rows per "
                                f"prompt, not {K} beams")
        metrics = PerformanceMetrics()
        t0 = time.perf_counter()
        start = self.model.start(np.asarray(prompt_ids, dtype=np.float32), start_pos,
                                 list(context_ids), metrics)
        running = [list(h) for h in start.history]          # B*K rows of ids
        P = len(running[0])
        limit = new_token_limit(s, max_new_tokens, P)
        n_new = min(limit, start.capacity)
        max_length = P + n_new
        processors = build_processors(s, P, max_length)
        eos = set(s.eos_token_id)
        keep = max(2, 1 + len(eos)) * K
        lp = F32(s.length_penalty)

        running_scores = np.zeros((B, K), dtype=F32)
        running_scores[:, 1:] = PENALTY
        finished = [[list(running[b * K]) for _ in range(K)] for b in range(B)]
        finished_scores = np.full((B, K), PENALTY, dtype=F32)
        finished_done = np.zeros((B, K), dtype=bool)
        improvable = np.ones(B, dtype=bool)
        cur_len = P
        logits = start.logits
        with metrics.phase("generation", 0):
            while True:
                logp = log_softmax(logits)
                for r, ids in enumerate(running):
                    for process in processors:
                        process(ids, logp[r])
                V = logp.shape[1]
                scores = (logp.reshape(B, K, V) + running_scores[:, :, None]).reshape(B, K * V)
                new_running, source_rows, hits_all = [], [], []
                next_scores = np.empty((B, K), dtype=F32)
                for b in range(B):
                    cand = top_k(scores[b], keep)
                    cand_scores = scores[b, cand]
                    beams, tokens = cand // V, cand % V
                    seqs = [running[b * K + int(k)] + [int(t)] for k, t in zip(beams, tokens)]
                    hits = np.array([int(t) in eos or cur_len + 1 >= max_length for t in tokens])
                    hits_all.append(hits)
                    # the K best that go on
                    go_on = cand_scores + hits.astype(F32) * PENALTY
                    chosen = top_k(go_on, K)
                    new_running += [seqs[i] for i in chosen]
                    source_rows += [b * K + int(beams[i]) for i in chosen]
                    next_scores[b] = go_on[chosen]
                    # finished hypotheses among the first K candidates
                    just = hits & (np.arange(keep) < K)
                    normed = cand_scores / F32((cur_len + 1 - P) ** s.length_penalty)
                    if s.early_stopping is True and finished_done[b].all():
                        normed = normed + PENALTY
                    if not improvable[b]:
                        normed = normed + PENALTY
                    normed = normed + (~just).astype(F32) * PENALTY
                    merged = np.concatenate([finished_scores[b], normed])
                    best = top_k(merged, K)
                    pool = finished[b] + seqs
                    done = np.concatenate([finished_done[b], just])
                    finished[b] = [pool[i] for i in best]
                    finished_scores[b] = merged[best]
                    finished_done[b] = done[best]
                running, running_scores = new_running, next_scores
                self.model.reorder(source_rows)
                cur_len += 1
                hypothetical = (max_length if s.early_stopping == "never" and lp > 0
                                else cur_len) - P
                best_possible = running_scores[:, 0] / F32(hypothetical ** s.length_penalty)
                worst = np.where(finished_done, finished_scores.min(axis=1, keepdims=True),
                                 PENALTY)
                improvable &= (best_possible[:, None] > worst).any(axis=1)
                open_beams = not (finished_done.all() and s.early_stopping is True)
                if not (improvable.any() and open_beams and not np.all(hits_all)):
                    break
                logits = self.model.step(np.array([ids[-1] for ids in running], dtype=F32))
                metrics.generation_tokens += 1

        result = GenerationResult(prompt_ids=[list(r) for r in prompt_ids], metrics=metrics,
                                  num_beams=K)
        for b in range(B):
            hyps = [{"generated_ids": finished[b][k][P:], "score": float(finished_scores[b, k])}
                    for k in range(s.num_return_sequences)]
            stopped = False
            if self.tokenizer is not None:
                cuts = [cut_at_stop(self.decode(h["generated_ids"], eos), s.stop_strings)
                        for h in hyps]
                for h, (text, _) in zip(hyps, cuts):
                    h["text"] = text
                stopped = cuts[0][1]
            result.sequences.append(hyps)
            best_ids = hyps[0]["generated_ids"]
            result.generated_ids.append(best_ids)
            result.finish_reasons.append("stop" if stopped
                                         else "eos" if best_ids and best_ids[-1] in eos
                                         else ("cache_full" if n_new < limit
                                               else "length"))
            if on_token is not None:
                for token in best_ids:
                    on_token(b, token)
        if self.tokenizer is not None:
            result.texts = [hyps[0]["text"] for hyps in result.sequences]
            if self.stream is not None:  # nothing streams until the best hypothesis is known
                self.stream.write(self.listing(result.sequences[0]))
                self.stream.flush()
        metrics.total_duration_ms = (time.perf_counter() - t0) * 1e3
        metrics.peak_memory_kb = peak_memory_kb()
        return result

    @staticmethod
    def listing(hyps: list[dict]) -> str:
        """What the stream shows of one prompt's hypotheses: the best text alone, or with
        several returned, a line ``[rank] (score) text`` per hypothesis, best first (no
        newline after the last: the caller ends the stream)."""
        if len(hyps) == 1:
            return hyps[0]["text"]
        return "\n".join(f"[{k}] ({h['score']:.4f}) {h['text']}" for k, h in enumerate(hyps, 1))

    def decode(self, ids: list[int], eos: set) -> str:
        """The text of a hypothesis, its EOS not included."""
        return self.tokenizer.Decode([t for t in ids if t not in eos], skip_special_tokens=True)
