"""LMBackend: admission control, abort, model-step failures, and the Orpheus audio path."""

from __future__ import annotations

import numpy as np
import pytest

from engine.llm.backend import MAX_CHUNK_SAMPLES
from tests.engine.llm.conftest import drain, make_backend, make_orpheus_program

GREEDY = dict(temperature=0.0, top_p=1.0, repetition_penalty=1.0)


def _add(backend, job_id: int, n: int = 6, max_tokens: int = 8, **opts) -> None:
    text = " ".join(str(100 + job_id * 10 + i) for i in range(n))
    backend.add_job(job_id, text, "v", dict(tag=job_id, max_tokens=max_tokens, **GREEDY, **opts))


def test_too_many_jobs_queue_up_to_the_bound_then_get_a_retryable_capacity_error(llm_model):
    """With room for 2 jobs and max_waiting=2, jobs 5 and 6 are refused; the rest all finish."""
    backend = make_backend(
        llm_model, runner_kw=dict(num_pages=8, page_size=4), sched_kw=dict(max_model_len=16, max_waiting=2)
    )
    for j in range(6):
        _add(backend, j)  # 6 + 8 tokens = 4 pages each: 2 fit in 8 pages
    assert backend.scheduler.num_running == 2 and backend.num_queued() == 2
    outs = drain(backend)
    errors = {o.job_id: o.error for o in outs if o.error}
    assert set(errors) == {4, 5}
    assert all(e.code == "capacity" and e.retryable for e in errors.values())
    finished = sorted(o.job_id for o in outs if o.is_finished)
    assert finished == [0, 1, 2, 3]
    assert all(len(backend.program.tokens[j]) == 8 for j in finished)
    assert backend.scheduler.allocator.num_free_pages == 8


def test_abort_of_queued_and_running_jobs_frees_pages_and_silences_them(llm_model):
    """Aborted jobs (running or queued) free their pages and never produce output again."""
    backend = make_backend(
        llm_model, runner_kw=dict(num_pages=8, page_size=4), sched_kw=dict(max_model_len=16, max_waiting=4)
    )
    for j in range(4):
        _add(backend, j)
    backend.step()
    backend.abort_job(0)  # running
    backend.abort_job(3)  # queued
    backend.abort_job(3)  # idempotent
    outs = drain(backend)
    assert {o.job_id for o in outs} == {1, 2}
    assert backend.scheduler.allocator.num_free_pages == 8 and not backend.has_work()


def test_a_failing_model_step_fails_its_jobs_and_the_next_step_works(llm_model):
    """An exception in execute fails that step's jobs with model_error; later jobs run fine."""
    backend = make_backend(llm_model)
    _add(backend, 0)
    _add(backend, 1)
    real = backend.runner.execute

    def boom(batch, feed=None):
        backend.runner.execute = real
        raise RuntimeError("injected failure")

    backend.runner.execute = boom
    outs = backend.step()
    assert sorted(o.job_id for o in outs) == [0, 1]
    assert all(o.error.code == "model_error" and "injected failure" in o.error.message for o in outs)
    assert backend.scheduler.allocator.num_free_pages == backend.scheduler.allocator.num_pages
    _add(backend, 2)
    outs = drain(backend)
    assert [o.job_id for o in outs if o.is_finished] == [2] and not any(o.error for o in outs)


def test_too_long_prompt_is_refused_with_a_clear_error(llm_model):
    """A prompt over max_model_len becomes that job's non-retryable too_long error."""
    backend = make_backend(llm_model, sched_kw=dict(max_model_len=32))
    _add(backend, 0, n=40)
    (out,) = backend.step()
    assert out.error.code == "too_long" and not out.error.retryable


@pytest.mark.parametrize("first_lookahead", [None, 1024], ids=["exact", "fast-start"])
def test_orpheus_stream_equals_whole_sequence_decode(llm_model, small_codec, first_lookahead):
    """Audio chunks (<= 100 ms) of a job concatenate to the codec's whole-sequence decode of
    the job's generated tokens (with fast start: past its 4096-sample leading edge); every
    sampled id is an audio id valid at its position."""
    from models.orpheus.tokens import tokens_to_codes

    program = make_orpheus_program(small_codec, first_lookahead_samples=first_lookahead)
    backend = make_backend(llm_model, program, runner_kw=dict(num_pages=128))
    backend.add_job(7, "hello world", "tara", dict(tag=7, temperature=0.9, top_p=0.95, seed=3, max_tokens=70))
    outs = drain(backend)
    assert not any(o.error for o in outs) and outs[-1].is_finished and outs[-1].job_id == 7
    assert all(o.pcm is None or o.pcm.size <= MAX_CHUNK_SAMPLES for o in outs)
    pcm = np.concatenate([o.pcm for o in outs if o.pcm is not None])
    tokens = program.tokens[7]
    whole = len(tokens) // 7 * 7
    codes = tokens_to_codes(tokens[:whole])  # raises if a token is invalid at its position
    ref = small_codec.decode(codes)[0].numpy()
    assert pcm.shape == ref.shape == (whole // 7 * 2048,)
    edge = 0 if first_lookahead is None else 4096
    np.testing.assert_allclose(pcm[edge:], ref[edge:], atol=1e-4)


def test_warmup_with_prefill_graphs_also_runs_a_chunked_prompt(llm_model):
    """With prefill graphs the warm-up adds a job whose prompt is longer than the largest graph,
    so a chunked (eager) step runs before serving; both jobs finish and free everything."""
    from types import SimpleNamespace

    backend = make_backend(llm_model, runner_kw=dict(num_pages=64, page_size=4),
                           sched_kw=dict(max_model_len=64, max_num_batched_tokens=12, max_num_prefill_tokens=8))
    backend.runner.prefill_graphs = SimpleNamespace(max_num_tokens=8)
    chunked = []
    real = backend.scheduler.schedule

    def spy():
        batch = real()
        if batch is not None:
            chunked.extend(n for n, done in zip(batch.num_new_tokens, batch.is_sampled) if n > 1 and not done)
        return batch

    backend.scheduler.schedule = spy
    backend.warmup(text="11 12 13", max_tokens=4)
    assert chunked  # the long prompt (12 tokens > 8) was split across steps
    assert not backend.has_work() and backend.scheduler.allocator.num_free_pages == 64


def test_backend_reports_the_step_period_while_steps_run_back_to_back(llm_model):
    """Each step call that takes the tokens of a step launched by the previous call reports the
    time between the two calls to the program; the first call of a burst reports nothing."""
    backend = make_backend(llm_model)
    _add(backend, 0, max_tokens=4)
    backend.step()
    assert backend.program.step_intervals == []  # nothing was running before it
    drain(backend)
    assert len(backend.program.step_intervals) >= 4 and all(t > 0 for t in backend.program.step_intervals)


def test_totals_count_rows_tokens_and_deferred_decodes(llm_model):
    """The backend's counters: one prefill row per prompt with its tokens, one decode row per
    token after the first, the decodes the cap deferred, and the step calls' time by the kind
    of step whose tokens they took."""
    backend = make_backend(llm_model, runner_kw=dict(num_pages=64, page_size=4),
                           sched_kw=dict(max_num_decode_seqs=1, max_num_batched_tokens=16))
    _add(backend, 0, n=6, max_tokens=8)
    _add(backend, 1, n=5, max_tokens=8)
    assert (backend.num_running(), backend.num_queued()) == (2, 0)  # the engine's gauges
    outs = drain(backend)
    assert sorted(o.job_id for o in outs if o.is_finished) == [0, 1]
    assert backend.num_running() == 0
    t = backend.totals()
    assert t["prefill_rows"] == 2 and t["prefill_tokens"] == 6 + 5
    assert t["decode_rows"] == 2 * 7  # the first token of each comes from its prefill
    assert t["deferred_decodes"] > 0  # one decode row per step: the other job waited
    assert t["lm_steps"] >= t["decode_rows"]
    assert t["light_busy_s"] == 0 and t["loaded_busy_s"] > 0  # no light steps: every step call is a loaded one's


def test_admission_hears_the_decode_cap_and_the_fill_of_rows_not_yet_due(llm_model):
    """``max_decode_rows``: the decode cap, else the batch slots; ``decode_fill_rows``: with a
    decode horizon the rows a step fills with jobs not yet due (within the cap), without one 0
    (every job decodes each step)."""
    def figures(**sched_kw):
        backend = make_backend(llm_model, sched_kw=dict(max_num_seqs=8, **sched_kw))
        return backend.max_decode_rows, backend.decode_fill_rows

    assert figures() == (8, 0)
    assert figures(max_num_decode_seqs=4) == (4, 0)
    assert figures(decode_horizon_s=1.0, decode_fill_seqs=6) == (8, 6)
    assert figures(decode_horizon_s=1.0, decode_fill_seqs=6, max_num_decode_seqs=4) == (4, 4)
    assert figures(decode_horizon_s=1.0, decode_fill_seqs=0) == (8, 1)  # the scheduler keeps one row


def test_a_decode_cap_set_while_serving_bounds_the_next_steps(llm_model):
    """``set_decode_cap`` (the engine core's measured cap): later steps run at most that many
    decode rows, the rest deferred, and every job still finishes; a negative cap is refused."""
    backend = make_backend(llm_model, runner_kw=dict(num_pages=64, page_size=4),
                           sched_kw=dict(max_num_seqs=8, max_num_batched_tokens=32))
    for job in range(3):
        _add(backend, job, n=4, max_tokens=10)
    backend.step()
    backend.set_decode_cap(1)
    assert backend.max_decode_rows == 1
    before = backend.totals()["deferred_decodes"]
    outs = drain(backend)
    assert sorted(o.job_id for o in outs if o.is_finished) == [0, 1, 2]
    assert backend.totals()["deferred_decodes"] > before
    with pytest.raises(ValueError, match="decode cap"):
        backend.set_decode_cap(-1)


def test_the_program_hears_how_soon_each_jobs_audio_is_due(llm_model):
    """``set_deadline`` passes the deadline on to the program as seconds from the scheduler's
    clock (the engine core's); unknown and finished jobs are ignored."""
    backend = make_backend(llm_model)
    backend.scheduler._clock = lambda: 100.0
    _add(backend, 1)
    _add(backend, 2)
    backend.set_deadline(1, 100.15)
    backend.set_deadline(2, 101.5)
    backend.set_deadline(99, 0.0)
    program = backend.program
    assert program.dues[0][0] is program.tokens[1] and program.dues[0][1] == pytest.approx(0.15)
    assert program.dues[1][0] is program.tokens[2] and program.dues[1][1] == pytest.approx(1.5)
    assert len(program.dues) == 2


def test_a_steps_audio_becomes_one_output_a_row_chunked_past_the_contracts_largest() -> None:
    """``LMBackend._outputs``: a row's one frame (a frame model's step) is its output as is; a
    longer or multi-part row is cut at MAX_CHUNK_SAMPLES in float32; a sequence that ended
    gets is_finished on its last output (an empty one without audio); a dropped job none."""
    from engine.llm.backend import LMBackend, _Inflight, _Taken
    from engine.llm.sequence import SamplingParams, Sequence

    seqs = [Sequence(i, [1], SamplingParams(max_tokens=10)) for i in range(5)]
    frame = np.arange(1920, dtype=np.float32)
    long = np.arange(MAX_CHUNK_SAMPLES + 100, dtype=np.float64)
    live = [(seqs[0], 0), (seqs[1], 0), (seqs[2], 0), (seqs[4], 0)]
    taken = _Taken(new=[(s, 0) for s in seqs], live=live, ended=[seqs[1], seqs[3]])
    work = _Inflight(taken, lambda: [frame, long, frame, frame], lambda: [frame[:10], None], dropped={4})
    outs = LMBackend.__new__(LMBackend)._outputs(work)
    assert [(o.job_id, o.pcm.size, o.is_finished) for o in outs] == [
        (0, 1920, False), (1, MAX_CHUNK_SAMPLES, False), (1, 110, True), (2, 1920, False), (3, 0, True)]
    assert outs[0].pcm is frame and all(o.pcm.dtype == np.float32 for o in outs)
    assert np.array_equal(np.concatenate([outs[1].pcm, outs[2].pcm]), np.concatenate([long, frame[:10]]))


def test_the_usual_steps_outputs_equal_the_general_paths() -> None:
    """A step where no row ended and none was dropped takes a shortcut from rows to outputs; it
    gives what the general path gives (a row without audio skipped, a long row chunked)."""
    import numpy as np

    from engine.llm.backend import MAX_CHUNK_SAMPLES, LMBackend, _Inflight, _Taken
    from engine.llm.sequence import SamplingParams, Sequence

    seqs = [Sequence(seq_id=i + 1, prompt_ids=[1], params=SamplingParams()) for i in range(4)]
    pcms = [np.full(1920, 0.5, np.float32), None, np.zeros(0, np.float32),
            np.arange(MAX_CHUNK_SAMPLES + 10, dtype=np.float32)]
    rows = [(s, [5]) for s in seqs]
    backend = LMBackend.__new__(LMBackend)  # _outputs reads only its argument

    def outputs(dropped: set[int]) -> list[tuple[int, list[float], bool]]:
        work = _Inflight(_Taken(new=rows, live=rows, ended=[]), lambda: pcms, lambda: [], dropped)
        return [(o.job_id, o.pcm.tolist(), o.is_finished) for o in backend._outputs(work)]

    fast, general = outputs(set()), outputs({999})  # (a job dropped that is not in the step: the general path)
    assert fast == general and [job for job, _, _ in fast] == [1, 4, 4]
