"""Scheduler: admission, bounded waiting queue, decode-first chunked prefill, abort."""

from __future__ import annotations

import pytest

from engine.llm.page_allocator import PageAllocator
from engine.llm.scheduler import RequestError, Scheduler, SchedulerConfig
from engine.llm.sequence import SamplingParams, Sequence, SequenceStatus


def _seq(i: int, n: int, max_tokens: int = 8) -> Sequence:
    return Sequence(i, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens))


def _sched(num_pages=16, page_size=4, **kw) -> Scheduler:
    cfg = dict(max_num_seqs=4, max_num_batched_tokens=8, max_model_len=64, max_waiting=2)
    cfg.update(kw)
    return Scheduler(SchedulerConfig(**cfg), PageAllocator(num_pages, page_size))


def _run_step(s: Scheduler, token: int = 7):
    batch = s.schedule()
    s.update(batch, [token] * batch.num_seqs)
    return batch


def test_admission_reserves_prompt_plus_max_tokens():
    """A running sequence holds pages for prompt + max_tokens; jobs beyond fit wait, then refuse."""
    s = _sched(num_pages=8, page_size=4, max_model_len=32)  # 32 tokens of cache
    s.add(_seq(0, 10, max_tokens=6))  # 16 tokens -> 4 pages
    s.add(_seq(1, 8, max_tokens=8))  # 4 pages
    assert [q.seq_id for q in s.running] == [0, 1] and s.allocator.num_free_pages == 0
    s.add(_seq(2, 4))
    s.add(_seq(3, 4))
    assert s.num_waiting == 2
    with pytest.raises(RequestError) as e:
        s.add(_seq(4, 4))
    assert e.value.error.code == "capacity" and e.value.error.retryable


def test_abort_frees_pages_of_running_and_queued_jobs():
    """Aborting frees a running job's pages (admitting the next) and drops a queued one."""
    s = _sched(num_pages=4, page_size=4, max_model_len=16)
    s.add(_seq(0, 8, max_tokens=8))
    s.add(_seq(1, 8, max_tokens=8))
    s.add(_seq(2, 8, max_tokens=8))
    assert s.num_running == 1 and s.num_waiting == 2
    assert s.abort(2).status == SequenceStatus.FINISHED
    s.abort(0)
    s.schedule()
    assert [q.seq_id for q in s.running] == [1] and s.num_waiting == 0
    s.abort(1)
    assert s.allocator.num_free_pages == 4 and s.abort(1) is None


def test_decodes_go_first_and_prefill_is_chunked_within_budget():
    """Decodes are never skipped; a long prompt is prefilled in chunks of the leftover budget."""
    s = _sched(num_pages=64, max_num_batched_tokens=8)
    s.add(_seq(0, 3))
    _run_step(s)  # seq 0 prefilled and sampled
    s.add(_seq(1, 20))
    chunks = []
    while s.running[1].is_prefill:
        batch = _run_step(s)
        assert batch.seqs[0].seq_id == 0 and batch.num_new_tokens[0] == 1 and batch.num_decode_seqs == 1
        assert batch.num_tokens <= 8
        chunks.append(batch.num_new_tokens[1])
    assert chunks == [7, 7, 6] and s.running[1].num_output_tokens == 1


def test_prompt_too_long_is_refused_and_max_tokens_capped():
    """prompt >= max_model_len is refused (not retryable); prompt + max_tokens is capped."""
    s = _sched(max_model_len=32)
    with pytest.raises(RequestError) as e:
        s.add(_seq(0, 32))
    assert e.value.error.code == "too_long" and not e.value.error.retryable
    seq = _seq(1, 20, max_tokens=100)
    s.add(seq)
    assert seq.params.max_tokens == 12


def test_config_validation():
    """Impossible settings are ValueErrors."""
    with pytest.raises(ValueError):
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=4)
    with pytest.raises(ValueError):
        Scheduler(SchedulerConfig(max_model_len=4096), PageAllocator(10, 16))


def test_waiting_jobs_are_admitted_earliest_deadline_first():
    """When a slot frees, the waiting job due soonest goes in; equal deadlines keep arrival order."""
    s = _sched(num_pages=4, page_size=4, max_model_len=16, max_waiting=4)
    s.add(_seq(0, 8, max_tokens=8))  # takes the whole cache
    for i in (1, 2, 3):
        s.add(_seq(i, 8, max_tokens=8))
    s.set_deadline(3, 10.0)  # a new stream's first segment
    s.set_deadline(1, 11.0)  # a segment generated ahead
    s.set_deadline(99, 1.0)  # unknown ids are ignored
    s.abort(0)
    s.schedule()
    assert [q.seq_id for q in s.running] == [3]
    s.abort(3)
    s.schedule()
    assert [q.seq_id for q in s.running] == [1]  # 11.0 before 2's none (infinity)


def test_prefill_budget_goes_to_the_earliest_deadline():
    """Two prompts compete for a small prefill budget: the one due sooner is prefilled first."""
    s = _sched(num_pages=64, max_num_batched_tokens=6)
    s.add(_seq(0, 6))
    s.add(_seq(1, 6))
    s.set_deadline(1, 5.0)
    s.set_deadline(0, 9.0)
    batch = s.schedule()
    assert [q.seq_id for q in batch.seqs] == [1] and batch.num_new_tokens == [6]


def test_whole_prompts_wait_for_the_next_step_instead_of_being_split():
    """With whole_prompts a prompt that fits a step on its own is never split; one that cannot
    fit any step alone is still chunked; max_num_prefill_seqs caps the prefill rows."""
    s = _sched(num_pages=64, page_size=4, max_num_batched_tokens=10, max_num_seqs=8, max_waiting=8,
               whole_prompts=True, max_num_prefill_seqs=2)
    for i, n in enumerate([4, 5, 2, 3]):
        s.add(_seq(i, n))
    batch = _run_step(s)
    assert [q.seq_id for q in batch.seqs] == [0, 1] and batch.num_new_tokens == [4, 5]  # 2 would fit, cap
    batch = _run_step(s)  # two decodes, then 2 and 3 whole
    assert [q.seq_id for q in batch.seqs] == [0, 1, 2, 3] and batch.num_new_tokens == [1, 1, 2, 3]
    s.add(_seq(4, 7))  # 4 decodes leave 6: 7 fits no step whole after 4 decodes -> chunked
    s.add(_seq(5, 3))
    batch = _run_step(s)
    assert batch.num_new_tokens == [1, 1, 1, 1, 6] and batch.is_sampled[-1] is False
    s2 = _sched(num_pages=64, page_size=4, max_num_batched_tokens=10, max_num_seqs=8, whole_prompts=True)
    s2.add(_seq(0, 6))
    s2.add(_seq(1, 6))
    batch = _run_step(s2)
    assert batch.num_new_tokens == [6]  # the second waits whole rather than splitting 4 + 2
    batch = _run_step(s2)
    assert batch.num_new_tokens == [1, 6]


def test_prefill_token_cap_holds_whatever_the_decodes_leave():
    """max_num_prefill_tokens bounds a step's prompt tokens even when few decodes leave most of
    the token budget (a packed prefill graph's size): a whole prompt that would pass it waits,
    one longer than it is chunked to it."""
    s = _sched(num_pages=64, page_size=4, max_num_batched_tokens=20, max_num_seqs=8, max_waiting=8,
               whole_prompts=True, max_num_prefill_tokens=8)
    s.add(_seq(0, 5))
    s.add(_seq(1, 4))
    batch = _run_step(s)
    assert [q.seq_id for q in batch.seqs] == [0] and batch.num_new_tokens == [5]  # 5 + 4 > 8: 1 waits whole
    s.add(_seq(2, 11))
    batch = _run_step(s)  # 11 > 8 fits no step whole: chunked into what is left
    assert [q.seq_id for q in batch.seqs] == [0, 1, 2] and batch.num_new_tokens == [1, 4, 4]
    assert batch.is_sampled[-1] is False
    batch = _run_step(s)
    assert batch.num_new_tokens == [1, 1, 7] and batch.is_sampled[-1] is True
    with pytest.raises(ValueError):
        SchedulerConfig(max_num_prefill_tokens=-1)


def test_prefill_cap_validation():
    """A negative prefill-row cap is refused."""
    with pytest.raises(ValueError):
        SchedulerConfig(max_num_prefill_seqs=-1)


def test_decode_cap_runs_earliest_deadlines_and_starves_nobody():
    """With max_num_decode_seqs, only the earliest-deadline decodes run; a skipped sequence keeps
    its pages, and once the others' deadlines move past it, it decodes."""
    s = _sched(num_pages=64, page_size=4, max_num_batched_tokens=16, max_num_seqs=4, max_waiting=8,
               max_num_decode_seqs=2)
    for i in range(3):
        s.add(_seq(i, 2, max_tokens=20))
    _run_step(s)  # the three prefills
    for seq, due in zip(s.running, (5.0, 1.0, 3.0)):
        s.set_deadline(seq.seq_id, due)
    batch = _run_step(s)
    assert [q.seq_id for q in batch.seqs] == [1, 2]  # 0 (due last) waits
    assert len(s.running[0].pages) > 0 and s.running[0].num_output_tokens == 1
    s.set_deadline(1, 6.0)  # as a stream's audio grows, its deadline moves on
    s.set_deadline(2, 7.0)
    batch = _run_step(s)
    assert [q.seq_id for q in batch.seqs] == [0, 1]
    with pytest.raises(ValueError):
        SchedulerConfig(max_num_decode_seqs=-1)


def test_decode_horizon_decodes_what_is_due_and_fills_small_steps():
    """With a decode horizon only the decodes due within it run (earliest first), topped up to
    the fill count; a buffered sequence skips steps, keeping its pages, until its deadline comes
    within the horizon; the cap still bounds the rows; one row always decodes."""
    now = [100.0]
    s = Scheduler(SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=32, max_model_len=64, max_waiting=8,
                                  decode_horizon_s=1.0, decode_fill_seqs=2, max_num_decode_seqs=3),
                  PageAllocator(128, 4), clock=lambda: now[0])
    for i in range(5):
        s.add(_seq(i, 2, max_tokens=30))
    _run_step(s)  # the five prefills
    dues = {0: 100.5, 1: 103.0, 2: 100.2, 3: 102.0, 4: 100.9}
    for i, due in dues.items():
        s.set_deadline(i, due)
    assert [q.seq_id for q in _run_step(s).seqs] == [2, 0, 4]  # due within 1 s, earliest first
    s.set_deadline(2, 101.5)
    s.set_deadline(0, 101.6)
    s.set_deadline(4, 101.7)
    assert [q.seq_id for q in _run_step(s).seqs] == [2, 0]  # none due: the fill count decodes
    skipped = next(q for q in s.running if q.seq_id == 1)
    assert skipped.pages and skipped.num_output_tokens == 1
    now[0] = 102.5  # time passes: 2, 0, 4 and 3 are due; the cap keeps the earliest three
    assert [q.seq_id for q in _run_step(s).seqs] == [2, 0, 4]
    now[0] = 102.1
    s.set_deadline(2, 200.0)
    s.set_deadline(0, 200.0)
    s.set_deadline(4, 200.0)
    assert [q.seq_id for q in _run_step(s).seqs] == [3, 1]  # 3 due, 1 fills
    one = Scheduler(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=8, max_model_len=64,
                                    decode_horizon_s=0.5), PageAllocator(64, 4), clock=lambda: 0.0)
    one.add(_seq(7, 2, max_tokens=10))
    one.add(_seq(8, 2, max_tokens=10))
    _run_step(one)
    one.set_deadline(7, 50.0)
    one.set_deadline(8, 40.0)
    assert [q.seq_id for q in _run_step(one).seqs] == [8]  # nothing due, no fill: still one row
    one.abort(7)
    one.add(_seq(9, 2, max_tokens=10))  # no deadline set: always due
    _run_step(one)  # its prefill
    assert [q.seq_id for q in _run_step(one).seqs] == [9]  # 8 is not due and the one row is taken
    for bad in ({"decode_horizon_s": -1.0}, {"decode_horizon_s": float("nan")}, {"decode_fill_seqs": -1}):
        with pytest.raises(ValueError):
            SchedulerConfig(**bad)


def test_prompts_wait_for_company_under_load_and_never_longer_than_the_wait_once_due():
    """With ``prefill_wait_s``, a busy step (at least ``decode_fill_seqs`` decode rows) holds
    fresh prompts back until ``prefill_batch_seqs`` are ready or a due one has waited that long;
    then all of them go, earliest deadline first. A prompt not yet due (beyond the decode
    horizon) waits until it is due or rides along; a lightly loaded step never holds one."""
    now = [100.0]
    s = Scheduler(SchedulerConfig(max_num_seqs=12, max_num_batched_tokens=64, max_model_len=64, max_waiting=8,
                                  decode_horizon_s=1.0, decode_fill_seqs=2, prefill_wait_s=0.02,
                                  prefill_batch_seqs=3),
                  PageAllocator(256, 4), clock=lambda: now[0])

    def prompts(batch) -> list[int]:
        return [q.seq_id for q in batch.seqs[batch.num_decode_seqs:]]

    s.add(_seq(0, 3, max_tokens=40))
    assert prompts(_run_step(s)) == [0]  # no decode rows: a light step never holds a prompt
    s.add(_seq(1, 3, max_tokens=40))
    assert prompts(_run_step(s)) == [1]  # one decode row, fewer than the fill count: goes at once
    for i in (0, 1):
        s.set_deadline(i, 100.5)
    s.add(_seq(2, 3, max_tokens=40))
    s.set_deadline(2, 100.15)  # a new stream's first segment: due
    assert prompts(_run_step(s)) == []  # two decode rows: it waits for company
    now[0] += 0.01
    s.add(_seq(3, 3, max_tokens=40))
    s.set_deadline(3, 103.0)  # a segment generated ahead: not due
    batch = _run_step(s)
    assert prompts(batch) == [] and batch.num_decode_seqs == 2  # the decodes never wait
    now[0] += 0.011  # 2 has waited 21 ms: it goes, and 3 rides along
    assert prompts(_run_step(s)) == [2, 3]

    for i in (4, 5):
        s.add(_seq(i, 3, max_tokens=40))
        s.set_deadline(i, 105.0)
    assert prompts(_run_step(s)) == []  # two, not due
    now[0] += 0.5
    assert prompts(_run_step(s)) == []  # still not due: they keep waiting, whatever the time
    s.add(_seq(6, 3, max_tokens=40))
    s.set_deadline(6, 106.0)
    assert prompts(_run_step(s)) == [4, 5, 6]  # three ready: they go together

    s.add(_seq(7, 3, max_tokens=40))
    s.set_deadline(7, 101.7)
    assert prompts(_run_step(s)) == []
    now[0] = 100.69
    assert prompts(_run_step(s)) == []  # not yet due
    now[0] = 100.71  # within the horizon now, and it has waited longer than 20 ms: it goes
    assert prompts(_run_step(s)) == [7]
    s.add(_seq(8, 3, max_tokens=40))  # no deadline: due at once
    assert prompts(_run_step(s)) == []
    now[0] += 0.021
    assert prompts(_run_step(s)) == [8]

    off = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64,
                                    decode_fill_seqs=1), PageAllocator(64, 4), clock=lambda: 0.0)
    off.add(_seq(0, 3, max_tokens=20))
    _run_step(off)
    off.add(_seq(1, 3, max_tokens=20))
    assert prompts(_run_step(off)) == [1]  # prefill_wait_s 0: off
    for bad in ({"prefill_wait_s": -0.1}, {"prefill_wait_s": float("nan")}, {"prefill_batch_seqs": -1}):
        with pytest.raises(ValueError):
            SchedulerConfig(**bad)


def test_hold_undue_prompts_keeps_segments_ahead_out_of_busy_steps_until_due():
    """With ``hold_undue_prompts``, a step of at least ``decode_fill_seqs`` decode rows takes
    only the prompts due within the decode horizon (a new stream's first segment), not the
    segments generated ahead, even as riders; those go once due or when a step is light again.
    Without it, both go at once."""
    now = [100.0]

    def sched(hold: bool) -> Scheduler:
        return Scheduler(SchedulerConfig(max_num_seqs=12, max_num_batched_tokens=64, max_model_len=64,
                                         max_waiting=8, decode_horizon_s=1.0, decode_fill_seqs=2,
                                         hold_undue_prompts=hold),
                         PageAllocator(256, 4), clock=lambda: now[0])

    def prompts(batch) -> list[int]:
        return [q.seq_id for q in batch.seqs[batch.num_decode_seqs:]]

    for hold in (True, False):
        now[0] = 100.0
        s = sched(hold)
        s.add(_seq(0, 3, max_tokens=40))
        s.set_deadline(0, 100.15)
        s.add(_seq(1, 3, max_tokens=40))
        s.set_deadline(1, 105.0)  # not due, but the step is light (no decode rows): it goes
        assert prompts(_run_step(s)) == [0, 1]
        for i in (0, 1):
            s.set_deadline(i, 100.5)
        s.add(_seq(2, 3, max_tokens=40))
        s.set_deadline(2, 100.15)  # a new stream's first segment: due
        s.add(_seq(3, 3, max_tokens=40))
        s.set_deadline(3, 102.5)  # its segment generated ahead: not due
        batch = _run_step(s)
        assert batch.num_decode_seqs == 2
        if not hold:
            assert prompts(batch) == [2, 3]
            continue
        assert prompts(batch) == [2]  # two decode rows: busy, so only the due prompt
        assert prompts(_run_step(s)) == []  # 3 keeps waiting while the steps are busy
        now[0] = 101.6  # within the horizon now: it goes
        assert prompts(_run_step(s)) == [3]

    s = sched(True)  # a light step (fewer decode rows than the fill) takes undue prompts too
    now[0] = 100.0
    s.add(_seq(0, 3, max_tokens=40))
    _run_step(s)
    s.set_deadline(0, 105.0)
    s.add(_seq(1, 3, max_tokens=40))
    s.set_deadline(1, 109.0)
    assert prompts(_run_step(s)) == [1]


def test_light_rows_take_steps_of_their_own_while_the_others_can_wait():
    """Light steps: rows below ``light_until_step`` tokens run alone (earliest deadlines first,
    at most ``light_max_rows``) for up to ``light_steps_max`` steps in a row, then a step of
    every due row; never while another due row's deadline is within ``light_slack_s``; rows
    all light, or none, make ordinary steps; off by default."""
    now = [100.0]
    cfg = dict(max_num_seqs=8, max_num_batched_tokens=32, max_model_len=64, max_waiting=8,
               decode_horizon_s=1.0, decode_fill_seqs=8)
    s = Scheduler(SchedulerConfig(**cfg, light_steps_max=2, light_until_step=3, light_max_rows=2, light_slack_s=0.25),
                  PageAllocator(128, 4), clock=lambda: now[0])
    for i in (0, 1):
        s.add(_seq(i, 2, max_tokens=40))
    for _ in range(3):
        assert [q.seq_id for q in _run_step(s).seqs] == [0, 1]  # all full (or all light): ordinary
    s.set_deadline(0, 100.9)
    s.set_deadline(1, 100.8)
    for i in (2, 3, 4):
        s.add(_seq(i, 2, max_tokens=40))
    assert sorted(q.seq_id for q in _run_step(s).seqs) == [0, 1, 2, 3, 4]  # 0, 1 decode; the prefills
    for i, due in ((2, 100.1), (3, 100.05), (4, 100.2)):
        s.set_deadline(i, due)
    picked = [[q.seq_id for q in _run_step(s).seqs] for _ in range(3)]
    # two light steps (3 and 2, the earliest two of three light rows), then every row
    assert picked == [[3, 2], [3, 2], [0, 1, 2, 3, 4]]
    s.set_deadline(2, 100.7)  # 2 and 3 have 3 tokens now (full rows); their audio grew
    s.set_deadline(3, 100.6)
    assert [q.seq_id for q in _run_step(s).seqs] == [4]  # 4 (2 tokens) alone
    s.add(_seq(5, 2, max_tokens=40))
    assert sorted(q.seq_id for q in _run_step(s).seqs) == [0, 1, 2, 3, 4, 5]  # none light; 5's prefill
    s.set_deadline(5, 100.05)
    s.set_deadline(1, 100.1)  # a full row due within the slack: no light step
    assert sorted(q.seq_id for q in _run_step(s).seqs) == [0, 1, 2, 3, 4, 5]
    s.set_deadline(1, 100.8)
    s.set_deadline(4, 100.5)
    assert [q.seq_id for q in _run_step(s).seqs] == [5]
    assert s.num_light_steps == 4
    off = Scheduler(SchedulerConfig(**cfg), PageAllocator(128, 4), clock=lambda: now[0])
    assert off.config.light_steps_max == 0
    for bad in ({"light_steps_max": -1}, {"light_max_rows": 0}, {"light_slack_s": float("nan")}):
        with pytest.raises(ValueError):
            SchedulerConfig(**bad)


def test_a_first_audio_target_does_not_stop_light_steps():
    """A row whose deadline is its first-audio target (``set_deadline(..., first_audio=True)``)
    does not stop light steps however close, a playing stream's row within the slack does."""
    now = [100.0]
    s = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64, max_waiting=4,
                                  decode_horizon_s=1.0, decode_fill_seqs=4, light_steps_max=4, light_until_step=3),
                  PageAllocator(64, 4), clock=lambda: now[0])
    s.add(_seq(0, 2, max_tokens=40))
    for _ in range(3):
        _run_step(s)  # 0 has 3 tokens: a full row
    s.add(_seq(1, 2, max_tokens=40))
    _run_step(s)  # 1's prefill
    s.set_deadline(1, 100.5)
    s.set_deadline(0, 99.9, first_audio=True)  # past its first-audio target: still no underrun
    assert [q.seq_id for q in _run_step(s).seqs] == [1]
    s.set_deadline(0, 100.03)  # playing, due within the 0.05 s slack
    assert [q.seq_id for q in _run_step(s).seqs] == [0, 1]
    assert SchedulerConfig().light_slack_s == 0.05
