"""A team program (causallm/kernels/team.py) and decode steps run as one (runtime/runner.py,
``team_plan``): ops see every task of the op before them whatever thread ran it, a region whose
threads the pool runs one after another still finishes, and a step's logits are those of its
plan run one kernel call at a time; tests/test_gguf.py and the parity tests check those against
transformers."""

import contextlib

import numba
import numpy as np
import parity
import pytest
from numba import njit

from causallm.kernels import team, threads
from causallm.runtime import runner
from causallm.runtime.runner import Team


@njit(cache=True)
def _fill(args, k0, k1):
    """Task k: x[k] = (k + 1) * f."""
    w = team.words(args, 3)
    x = team.array1(w, 0, np.float64)
    for k in range(k0, k1):
        x[k] = (k + 1) * team.real(args, 2)


@njit(cache=True)
def _prefix(args, k0, k1):
    """Task k: y[k] = x[0] + ... + x[k] (every task of the op before)."""
    w = team.words(args, 4)
    x, y = team.array1(w, 0, np.float64), team.array1(w, 2, np.float64)
    for k in range(k0, k1):
        s = 0.0
        for j in range(k + 1):
            s += x[j]
        y[k] = s


@pytest.mark.parametrize("n_threads", [1, 2])
def test_each_op_sees_every_task_of_the_op_before(n_threads):
    n = 200
    x, y = np.zeros(n), np.zeros(n)
    ops = [(team.address(_fill), team.encode(x, 0.5), n),
           (team.address(_prefix), team.encode(x, y), n)]
    ops += ops  # the same ops again: their counters are each op's own
    program = team.Program(ops)
    for _ in range(20):
        y[:] = 0
        program.run(n_threads)
        np.testing.assert_array_equal(y, 0.5 * np.arange(1, n + 1).cumsum())


@pytest.mark.parametrize("n_threads", [1, 2])
def test_a_timed_run_gives_the_same_values_and_each_threads_times(n_threads):
    """A trace (bench/team_trace.py's profile) records, for each thread and op, the cycle
    counts of its coming to the op, its running out of tasks and the op's end, in that order,
    each before its coming to the next op; the values are the untimed run's."""
    n = 300
    x, y = np.zeros(n), np.zeros(n)
    ops = [(team.address(_fill), team.encode(x, 0.25), n),
           (team.address(_prefix), team.encode(x, y), n)] * 2
    program = team.Program(ops)
    trace = np.zeros((n_threads, len(ops), 3), dtype=np.int64)
    before = team.clock()
    program.run(n_threads, trace)
    after = team.clock()
    np.testing.assert_array_equal(y, 0.25 * np.arange(1, n + 1).cumsum())
    assert (before <= trace).all() and (trace <= after).all()
    assert (np.diff(trace, axis=2) >= 0).all()  # came <= ran out of tasks <= op done
    assert (trace[:, 1:, 0] >= trace[:, :-1, 2]).all()


def test_a_region_whose_threads_run_in_turn_still_finishes():
    """Two walks of the program on one pool thread (numba runs the prange's two iterations in
    turn): the first runs every task, the second finds none left; no thread waits for a task
    nobody claimed."""
    n = 50
    x, y = np.zeros(n), np.zeros(n)
    program = team.Program([(team.address(_fill), team.encode(x, 1.0), n),
                            (team.address(_prefix), team.encode(x, y), n)])
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        program.run(2)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(y, np.arange(1, n + 1).cumsum())


def test_an_array_an_op_cannot_read_is_refused():
    assert team.encode(np.zeros((4, 4))[:, ::2]) is None
    words = team.encode(np.zeros((2, 3), np.float32), 7, 0.25)
    assert words[1:4].tolist() == [2, 3, 7]
    assert words[4] == np.float64(0.25).view(np.int64)


def _load(name, fmt=None):
    model = parity.load_folder(name, initialize=False, init_seq_len=64, num_to_generate=64)
    model.precision.setWeightFormat(fmt)
    model.initialize()
    model.load_weight()
    return model


def _steps(model, ref, n):
    logits = [parity.prefill(model, ref["prompt_ids"])]
    P = len(ref["prompt_ids"])
    for k in range(1, n):
        logits.append(parity.decode_step(model, ref["tokens"][k - 1], P + k - 1))
    return np.stack(logits)


@pytest.mark.parametrize("name", ["gguf-llama-q8_0", "gguf-qwen3-q4_0"])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_a_decode_step_is_one_team_program_with_the_plans_values(name, n_threads, monkeypatch):
    """After the embedding, a one-row step runs every layer (norms and their residual
    additions, the block products, Qwen3's q / k norms, attention with its cache write, swiglu,
    the final norm and the head) as one program; its logits over many cached steps are within
    the int8 activations' distance of transformers', and those of the same plan run one kernel
    call at a time, bit for bit."""
    with _threads(n_threads):
        model, ref, teamed, stage = _teamed_steps(name, parity.INT8_ACTIVATIONS_RTOL)
        execution = stage.execution(1)
        teams = [entry for entry, _ in execution if isinstance(entry, Team)]
        assert len(teams) == 1 and execution[-1][0] is teams[0]
        names = teams[0].name.split("+")
        for i in range(model.NUM_LAYERS):
            assert {f"layer{i}_attention", f"layer{i}_wq", f"layer{i}_ffn_down"} <= set(names)
        assert names[-1] == "output_of_causallm"
        monkeypatch.setattr(runner, "TEAM_MAX_ROWS", 0)
        assert stage.execution(1) == stage.plan
        np.testing.assert_array_equal(_steps(model, ref, len(teamed)), teamed)


@pytest.mark.parametrize("name, fmt", [("gguf-gemma3-f16", None), ("llama-f16-yarn-bias", None),
                                       ("llama-hd80-bf16-sharded", None), ("qwen2-gqa4", "FP32")])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_a_float_models_decode_step_is_one_team_program_too(name, fmt, n_threads, monkeypatch):
    """F16, BF16 and float32 matrices multiply in the program too (Gemma 3 with its sandwich
    norms, q / k norms and gelu-tanh; Llama's F16 with biases, its BF16 with a tied head; Qwen2's
    biased q / k / v widened to float32 at load): after the embedding a one-row step is one
    program, its logits match transformers' and are the plan's, bit for bit."""
    with _threads(n_threads):
        model, ref, teamed, stage = _teamed_steps(name, parity.RTOL, fmt)
        execution = stage.execution(1)
        teams = [entry for entry, _ in execution if isinstance(entry, Team)]
        assert len(teams) == 1 and execution[-1][0] is teams[0]
        assert "layer0_wq" in teams[0].name.split("+")
        monkeypatch.setattr(runner, "TEAM_MAX_ROWS", 0)
        assert stage.execution(1) == stage.plan
        np.testing.assert_array_equal(_steps(model, ref, len(teamed)), teamed)


def _teamed_steps(name, rtol, fmt=None):
    """The fixture held as stored (or as ``fmt``), its prompt and cached steps run, their
    logits within ``rtol`` of transformers', and its stage."""
    model, ref = _load(name, fmt), parity.expected(name)
    logits = _steps(model, ref, len(ref["tokens"]))
    for k, row in enumerate(logits):
        parity.assert_logits_close(row, ref["step_logits"][k], f"{name}, step {k}", rtol)
    return model, ref, logits, model.model._stage(None)


@contextlib.contextmanager
def _threads(n):
    before = threads.threads()
    threads.set_threads(n)
    try:
        yield
    finally:
        threads.set_threads(before)


def test_a_longer_prompt_makes_the_steps_rows_anew_and_the_programs_with_them():
    """A prompt longer than any before makes the step's row arrays anew (StageState); the
    programs, which read the rows there, are made again, and the cached steps after it stay
    within the int8 activations' distance of transformers."""
    name = "gguf-qwen3-q4_0"
    model, ref = _load(name), parity.expected(name)
    stage = model.model._stage(None)
    parity.prefill(model, ref["prompt_ids"][:2])
    parity.decode_step(model, ref["prompt_ids"][2], 2)
    first, rows = stage.execution(1), stage.state.positions
    parity.check_close(model, ref, parity.INT8_ACTIVATIONS_RTOL, parity.INT8_ACTIVATIONS_MARGIN,
                       "int8 activations after a longer prompt")
    assert stage.state.positions is not rows
    assert stage.execution(1) is not first
