"""Asynchronous steps (``LMBackend(async_steps=True)``) give the tokens and audio of the
synchronous loop."""

from __future__ import annotations

import numpy as np
import torch

from engine.llm.sequence import PENDING
from tests.engine.llm.conftest import TokenProgram, drain, make_backend, make_orpheus_program

# Every row is sampled from its own noise, so a wasted row (a sequence that stopped at step N,
# still in N+1, launched before N's tokens reached the host) changes no other row.
SAMPLED = dict(temperature=0.9, top_p=0.95, repetition_penalty=1.1)


def _run(model, program, jobs, *, async_steps, sched_kw=None, runner_kw=None, abort_at=None):
    backend = make_backend(model, program, sched_kw=sched_kw, runner_kw=runner_kw)
    backend.async_steps = async_steps
    for job_id, text, opts in jobs:
        backend.add_job(job_id, text, "tara", dict(opts, tag=job_id))
    outs = []
    steps = 0
    while backend.has_work():
        outs.extend(backend.step())
        steps += 1
        if abort_at is not None and steps == abort_at[0]:
            backend.abort_job(abort_at[1])
        assert steps < 5000
    sched = backend.scheduler
    assert not sched.running and sched.allocator.num_free_pages == sched.allocator.num_pages
    return outs, steps


def _by_job(outs):
    per: dict[int, list] = {}
    for o in outs:
        per.setdefault(o.job_id, []).append(o)
    return per


def test_async_steps_give_the_same_tokens_with_stops_max_tokens_and_admission_waves(llm_model):
    """More jobs than batch slots (admissions as others end), stops drawn at random (one id in
    40 stops), max_tokens from 1 to 30, a decode cap: the same tokens per job, the same
    finished/error outputs, and the async loop takes at most two calls more (it takes the last
    step's tokens one call later, and collects their audio one call after that)."""
    stops = frozenset(range(0, 156_940, 40))
    jobs = [(i, " ".join(str(10 + (i * 7 + k) % 50) for k in range(2 + i % 5)),
             dict(SAMPLED, seed=100 + i, max_tokens=1 + (i * 7) % 30)) for i in range(14)]
    results = []
    for async_steps in (False, True):
        program = TokenProgram(stop_ids=stops)
        outs, steps = _run(llm_model, program, jobs, async_steps=async_steps,
                           sched_kw=dict(max_num_decode_seqs=5), runner_kw=dict(num_pages=96))
        results.append((program.tokens, _by_job(outs), steps))
    (sync_tokens, sync_outs, sync_steps), (async_tokens, async_outs, async_steps_taken) = results
    assert async_tokens == sync_tokens
    assert any(len(t) < jobs[i][2]["max_tokens"] for i, t in sync_tokens.items())  # some stopped early
    for job_id, outs in sync_outs.items():
        a = async_outs[job_id]
        assert [(o.is_finished, o.error) for o in a] == [(o.is_finished, o.error) for o in outs]
    assert all(PENDING not in t for t in async_tokens.values())
    assert async_steps_taken <= sync_steps + 2  # the last step's tokens, then its audio, one call each


def test_async_steps_give_the_same_orpheus_audio(llm_model, small_codec):
    """Orpheus with the position constraint (each token's allowed row is computed before the
    previous token is known): the same audio, sample for sample, and the same tokens."""
    jobs = [(i, text, dict(SAMPLED, seed=7 + i, max_tokens=n))
            for i, (text, n) in enumerate([("hello world", 40), ("a second job", 29), ("three", 64)])]
    audio, tokens = [], []
    for async_steps in (False, True):
        program = make_orpheus_program(small_codec, first_lookahead_samples=1024)
        outs, _ = _run(llm_model, program, jobs, async_steps=async_steps, runner_kw=dict(num_pages=128))
        assert not any(o.error for o in outs)
        audio.append({j: np.concatenate([o.pcm for o in os if o.pcm is not None]) for j, os in _by_job(outs).items()})
        tokens.append(program.tokens)
    assert tokens[0] == tokens[1]
    assert audio[0].keys() == audio[1].keys()
    for j in audio[0]:
        np.testing.assert_array_equal(audio[0][j], audio[1][j])


def test_abort_while_a_step_is_in_flight_leaves_the_others_unchanged(llm_model):
    """A job aborted between launch and take: its tokens stop, its pages come back, and the
    other jobs' tokens are those of the run without async steps."""
    jobs = [(i, f"{20 + i} {30 + i} {40 + i}", dict(SAMPLED, seed=i, max_tokens=20)) for i in range(3)]
    ref = TokenProgram()
    _run(llm_model, ref, jobs, async_steps=False)
    program = TokenProgram()
    outs, _ = _run(llm_model, program, jobs, async_steps=True, abort_at=(6, 1))
    assert program.tokens[0] == ref.tokens[0] and program.tokens[2] == ref.tokens[2]
    assert len(program.tokens[1]) < len(ref.tokens[1]) and program.tokens[1] == ref.tokens[1][: len(program.tokens[1])]
    assert not any(o.job_id == 1 and o.is_finished for o in outs)


class _SampleProgram(TokenProgram):
    """One audio sample per token, its value the token: audio that says which step made it."""

    def launch_postprocess(self, states, tokens):
        super().launch_postprocess(states, tokens)
        return lambda: [np.full(1, float(t), np.float32) for t in tokens]


def test_no_audio_comes_out_for_a_job_after_its_abort(llm_model):
    """The audio of a step is collected one call after its codec work starts: a job aborted in
    between gets none of it (``abort_job``: no output for that job afterwards), the others get
    all of theirs, in order."""
    jobs = [(i, f"{20 + i} {30 + i}", dict(SAMPLED, seed=i, max_tokens=12)) for i in range(3)]
    backend = make_backend(llm_model, _SampleProgram())
    backend.async_steps = True
    for job_id, text, opts in jobs:
        backend.add_job(job_id, text, "tara", dict(opts, tag=job_id))
    before, after = [], []
    aborted = False
    while backend.has_work():
        outs = backend.step()
        (after if aborted else before).extend(outs)
        if not aborted and any(o.job_id == 1 and o.pcm is not None and o.pcm.size for o in outs):
            assert 1 in {s.seq_id for s, _ in backend._inflight.taken.new}  # more of its audio on its way
            backend.abort_job(1)
            aborted = True
    assert not any(o.job_id == 1 for o in after)
    program = backend.program
    for j in (0, 2):
        pcm = np.concatenate([o.pcm for o in before + after if o.job_id == j and o.pcm is not None])
        np.testing.assert_array_equal(pcm, np.asarray(program.tokens[j], np.float32))


class _FailingCollect(_SampleProgram):
    """Audio work launched while ``fail`` is set raises when collected."""

    fail = False

    def launch_postprocess(self, states, tokens):
        collect = super().launch_postprocess(states, tokens)
        if not self.fail:
            return collect

        def broken():
            raise RuntimeError("codec exploded")

        return broken


def test_a_failed_collection_fails_its_jobs_but_not_one_aborted_meanwhile(llm_model):
    """The codec work of one step fails when collected, a call later: its jobs get
    ``model_error``, except one aborted in between, which gets nothing (``abort_job``)."""
    program = _FailingCollect()
    backend = make_backend(llm_model, program)
    backend.async_steps = True
    for i in range(3):
        backend.add_job(i, f"{20 + i} {30 + i}", "tara", dict(SAMPLED, seed=i, max_tokens=30, tag=i))
    for _ in range(6):
        assert not any(o.error for o in backend.step())
    program.fail = True
    backend.step()  # launches the audio work that will fail
    program.fail = False
    assert {s.seq_id for s, _ in backend._inflight.taken.new} == {0, 1, 2}
    backend.abort_job(1)
    outs = backend.step()  # collects it
    errors = {o.job_id: o.error for o in outs if o.error is not None}
    assert set(errors) == {0, 2} and all(e.code == "model_error" and "codec exploded" in e.message
                                         for e in errors.values())
    assert not any(o.job_id == 1 for o in outs)
    drain(backend)
    assert backend.scheduler.allocator.num_free_pages == backend.scheduler.allocator.num_pages


def _emulated_graph_runner(model, max_num_seqs: int = 8):
    """``CudaGraphModelRunner`` on the CPU with each replay run as its step function."""
    import copy

    from engine.llm.attention import torch_paged_attention_factory
    from engine.llm.cuda_graphs import CudaGraphModelRunner
    from models.orpheus.fused_forward import FusedLlamaForward
    from tests.engine.llm.graph_emulation import emulate_replays

    runner = CudaGraphModelRunner(copy.deepcopy(model), model.config, device="cpu", dtype=torch.float32,
                                  num_pages=96, page_size=4, max_num_seqs=max_num_seqs, capture=False,
                                  prefill_buckets=(32,), attention_backend_factory=torch_paged_attention_factory)
    runner.forward_fn = FusedLlamaForward(runner.model, compile=False)
    emulate_replays(runner, num_tokens=32)
    return runner


def test_async_steps_on_the_graph_path_feed_tokens_on_the_device(llm_model):
    """The CUDA-graph runner's path, emulated on the CPU: decode rows whose last token is still
    pending take it from the launched step's token tensor (``DecodeInputBuilder`` column 5,
    ``_decode_args``), whole prompts are packed, and the tokens are the synchronous loop's."""
    from engine.llm.backend import LMBackend
    from engine.llm.page_allocator import PageAllocator
    from engine.llm.scheduler import Scheduler, SchedulerConfig

    stops = frozenset(range(0, 156_940, 60))
    jobs = [(i, " ".join(str(10 + (i * 3 + k) % 40) for k in range(3 + i % 4)),
             dict(SAMPLED, seed=50 + i, max_tokens=3 + (i * 5) % 17)) for i in range(10)]
    results = []
    for async_steps in (False, True):
        runner = _emulated_graph_runner(llm_model)
        eager = [0]
        real_eager = runner._execute_eager

        def count_eager(*a, _real=real_eager, **kw):  # noqa: ANN002, ANN003, ANN202
            eager[0] += 1
            return _real(*a, **kw)

        runner._execute_eager = count_eager
        sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=40, max_model_len=64, max_waiting=16,
                                          max_num_prefill_seqs=4, max_num_prefill_tokens=32, whole_prompts=True),
                          PageAllocator(runner.scratch_page, 4))
        program = TokenProgram(stop_ids=stops)
        backend = LMBackend(program, runner, sched, async_steps=async_steps)
        for job_id, text, opts in jobs:
            backend.add_job(job_id, text, "v", dict(opts, tag=job_id))
        outs = drain(backend)
        assert not any(o.error for o in outs) and eager[0] == 0
        assert sched.allocator.num_free_pages == sched.allocator.num_pages
        results.append(program.tokens)
    assert results[0] == results[1]
    assert any(len(t) < jobs[i][2]["max_tokens"] for i, t in results[0].items())  # some stopped early
