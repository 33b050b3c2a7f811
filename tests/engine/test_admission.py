"""engine.admission: capacity from measured step times, and the queue / refuse / off policy,
on a fake clock with simulated step times (no sleeps)."""

from __future__ import annotations

import pytest

from engine.admission import Admission, AdmissionConfig

ORPHEUS_TOKENS_PER_S = 7 * 24000 / 2048  # 82.03


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _step_s(rows: int, *, scale: float = 1.0) -> float:
    return scale * (0.0032 + 20.6e-6 * rows)


def _true_capacity(headroom: float = 0.1, *, scale: float = 1.0) -> float:
    """Streams N with ORPHEUS_TOKENS_PER_S * t(N) = 1 - headroom (no decode cap)."""
    return ((1 - headroom) / ORPHEUS_TOKENS_PER_S / scale - 0.0032) / 20.6e-6


def _measured(config: AdmissionConfig | None = None, *, scale: float = 1.0, steps: int = 2000,
              clock: FakeClock | None = None) -> Admission:
    """An Admission that has seen ``steps`` steps of 1..450 rows."""
    adm = Admission(config or AdmissionConfig(), tokens_per_audio_second=ORPHEUS_TOKENS_PER_S,
                    clock=clock or FakeClock())
    _run_steps(adm, steps, scale=scale)
    return adm


def _run_steps(adm: Admission, steps: int, *, scale: float = 1.0) -> None:
    for i in range(steps):
        rows = 1 + (i * 37) % 450
        adm.observe_step(rows, 0, _step_s(rows, scale=scale), max_rows=0)


def _config(**kw: object) -> AdmissionConfig:
    return AdmissionConfig(**kw)  # type: ignore[arg-type]


def test_capacity_is_what_keeps_real_time_with_the_headroom() -> None:
    """From simulated step times the capacity is the largest N whose N x 82 tokens a second
    fit in 90% of the engine's time, within 2%."""
    adm = _measured()
    assert adm.is_measured
    assert adm.capacity() == pytest.approx(_true_capacity(), rel=0.02)
    assert adm.utilisation(adm.capacity()) <= 0.9  # type: ignore[arg-type]
    assert adm.utilisation(adm.capacity() + 2) > 0.9  # type: ignore[operator]


def test_a_decode_cap_limits_capacity_by_its_steps_time() -> None:
    """With at most 256 decode rows a step, N > 256 streams share them: capacity is
    0.9 x 256 / (82 x t(256))."""
    adm = _measured()
    adm.observe_step(256, 0, _step_s(256), max_rows=256)
    expected = 0.9 * 256 / (ORPHEUS_TOKENS_PER_S * _step_s(256))
    assert adm.capacity() == pytest.approx(expected, rel=0.02)


def _voxcpm2_step_s(rows: float) -> float:
    """VoxCPM2's step on an H200 (b023620, per-second means): 34.5 ms + 0.58 ms a row."""
    return 0.0345 + 0.00058 * rows


def test_segments_generated_ahead_count_at_the_rows_they_add_to_each_step() -> None:
    """Streams that hold two jobs each (the spoken segment and the one generated ahead), every
    job decoding each step: a step runs 2N rows and a stream's row still advances once a step,
    so the capacity is the N with 6.25 x t(2N) <= 0.9 (94 VoxCPM2 streams), not t(N) (188)."""
    adm = Admission(AdmissionConfig(), tokens_per_audio_second=6.25, clock=FakeClock())
    for key in range(60):
        adm.request(key)
    for i in range(3000):
        rows = 1 + (i * 37) % 300
        adm.observe_step(rows, 0, _voxcpm2_step_s(rows), max_rows=1024, fill_rows=0, jobs=120)
    assert adm.jobs_per_stream() == pytest.approx(2.0)
    expected = (0.9 / 6.25 - 0.0345) / 0.00058 / 2
    assert adm.capacity() == pytest.approx(expected, rel=0.03)
    assert adm.rows_per_step(adm.capacity()) == pytest.approx(2 * adm.capacity())  # type: ignore[arg-type]


def test_a_decode_fill_keeps_rows_ahead_within_it() -> None:
    """With a decode horizon the scheduler decodes jobs not yet due only up to its fill (256
    rows), and every due stream past that: two jobs a stream then leave the capacity at the
    one-row-a-stream figure when a step of 256 rows keeps real time (Orpheus); without a
    horizon every job decodes, up to the cap of 384, and the capacity is what keeps 2N rows
    real time."""
    def measured(fill_rows: int) -> Admission:
        adm = Admission(AdmissionConfig(), tokens_per_audio_second=ORPHEUS_TOKENS_PER_S, clock=FakeClock())
        for key in range(100):
            adm.request(key)
        for i in range(3000):
            rows = 1 + (i * 37) % 450
            adm.observe_step(rows, 0, _step_s(rows), max_rows=384, fill_rows=fill_rows, jobs=200)
        return adm

    one_row_each = _measured()
    one_row_each.observe_step(300, 0, _step_s(300), max_rows=384)
    with_fill = measured(256)
    assert with_fill.rows_per_step(100) == 200 and with_fill.rows_per_step(200) == 256
    assert with_fill.rows_per_step(300) == 300 and with_fill.rows_per_step(500) == 384
    assert with_fill.capacity() == pytest.approx(one_row_each.capacity(), abs=2)
    assert with_fill.capacity() == pytest.approx(_true_capacity(), rel=0.02)
    assert measured(0).capacity() == pytest.approx(_true_capacity() / 2, rel=0.02)


def test_prompts_take_their_share_of_the_engine() -> None:
    """Steps with prompt tokens cost more (4 us a token); the prompts of the streams speaking
    lower the capacity below the decode-only figure."""
    adm = Admission(AdmissionConfig(), tokens_per_audio_second=ORPHEUS_TOKENS_PER_S, clock=FakeClock())
    for key in range(200):  # 200 streams speaking while the steps are measured
        adm.request(key)
    for i in range(3000):
        rows = 1 + (i * 37) % 450
        prompt = 300 if i % 10 == 0 else 0
        adm.observe_step(rows, prompt, _step_s(rows) + 4e-6 * prompt, max_rows=0)
    assert adm.prefill_share() > 0
    assert adm.capacity() < _true_capacity() * 0.99


def _ramp(seconds: float, *, streams: int = 64, per_s: float = 6.4) -> list[tuple[float, float]]:
    """VoxCPM2-like streams starting at ``per_s`` a second: 4 segments of 63 rows, two at a
    time (the spoken one and the one ahead), a prompt of 13 tokens each as it starts (2 ms a
    token); every job decodes each step. Returns (time, prefill share) after each step."""
    clock = FakeClock()
    adm = Admission(AdmissionConfig(policy="off"), tokens_per_audio_second=6.25, clock=clock)
    t0, started, out = clock.t, 0, []
    live: dict[int, list[int]] = {}  # stream -> [segments not yet started, rows left per job...]
    while clock.t - t0 < seconds:
        while started < streams and started <= (clock.t - t0) * per_s:
            live[started] = [4]
            adm.request(started)
            started += 1
        prompt = 0
        for jobs in live.values():
            while len(jobs) < 3 and jobs[0] > 0:
                jobs[0] -= 1
                jobs.append(63)
                prompt += 13
        rows = sum(len(jobs) - 1 for jobs in live.values())
        step = _voxcpm2_step_s(rows) + 0.002 * prompt
        clock.t += step
        for key in list(live):
            jobs = live[key]
            jobs[1:] = [n - 1 for n in jobs[1:] if n > 1]
            if len(jobs) == 1 and jobs[0] == 0:
                del live[key]
                adm.release(key)
        adm.observe_step(rows, prompt, step, max_rows=1024, fill_rows=0, jobs=rows)
        out.append((clock.t - t0, adm.prefill_share()))
    return out


def test_a_ramp_of_young_streams_does_not_inflate_the_prompts_share() -> None:
    """The prompts' share is taken per row a stream makes in real time (2 ms x 13 tokens per 63
    rows x 6.25 rows a second: 2.6 ms a second), so 3 s into a ramp of starting streams, each
    with its first two prompts sent, it reads under 3 times that (tokens per second spoken
    read 11 times), and once the streams have spoken, within 15%."""
    steady = 0.002 * 13 / 63 * 6.25
    shares = _ramp(40.0)
    early = next(share for t, share in shares if t >= 3.0)
    assert early < 3 * steady
    assert shares[-1][1] == pytest.approx(steady, rel=0.15)


def test_the_capacity_follows_a_slower_device() -> None:
    """Step times 30% longer from some point on: the capacity moves to the new figure."""
    adm = _measured()
    before = adm.capacity()
    _run_steps(adm, 4000, scale=1.3)
    assert adm.capacity() == pytest.approx(_true_capacity(scale=1.3), rel=0.03)
    assert adm.capacity() < before  # type: ignore[operator]


def _true_cap(budget: float, *, scale: float = 1.0) -> float:
    """Rows B with t(B) = budget x the real-time step (1 / ORPHEUS_TOKENS_PER_S)."""
    return (budget / ORPHEUS_TOKENS_PER_S / scale - 0.0032) / 20.6e-6


def test_the_measured_decode_cap_keeps_steps_within_the_budget_and_follows_the_device() -> None:
    """``decode_cap_budget`` 0.8: the cap is the most rows whose fitted step takes at most 80%
    of the real-time step (9.75 ms for 82 tokens a second: 318 rows here), within the limit
    given; on a device 30% slower it moves down with the fit; off or unmeasured, there is none."""
    adm = _measured(_config(decode_cap_budget=0.8))
    cap = adm.measured_decode_cap(1024)
    assert cap == pytest.approx(_true_cap(0.8), rel=0.02)
    assert adm.model.predict(cap) <= 0.8 / ORPHEUS_TOKENS_PER_S < adm.model.predict(cap + 1)  # type: ignore[operator]
    assert adm.measured_decode_cap(200) == 200  # the backend's own cap bounds it
    _run_steps(adm, 4000, scale=1.3)
    slower = adm.measured_decode_cap(1024)
    assert slower == pytest.approx(_true_cap(0.8, scale=1.3), rel=0.03) and slower < cap  # type: ignore[operator]
    assert _measured().measured_decode_cap(1024) is None  # off by default (-1, the model's, unresolved)
    assert _measured(_config(decode_cap_budget=0.0)).measured_decode_cap(1024) is None  # off
    young = Admission(_config(decode_cap_budget=0.8), tokens_per_audio_second=ORPHEUS_TOKENS_PER_S)
    assert young.measured_decode_cap(1024) is None  # not measured yet
    tight = _measured(_config(decode_cap_budget=0.2))  # even one row's step is over 20% of 12.2 ms
    assert tight.measured_decode_cap(1024) == 1


def test_cold_start_admits_up_to_the_initial_capacity() -> None:
    """Before min_samples steps are measured the initial capacity holds (none by default)."""
    assert Admission(AdmissionConfig(), tokens_per_audio_second=82.0).capacity() is None
    adm = Admission(_config(initial_capacity=3, policy="refuse"), tokens_per_audio_second=82.0)
    verdicts = [adm.request(k).verdict for k in range(4)]
    assert verdicts == ["admit", "admit", "admit", "refuse"]
    _run_steps(adm, 50)
    assert not adm.is_measured and adm.capacity() == 3


def test_a_backend_that_is_not_step_based_has_only_the_initial_capacity() -> None:
    """No tokens_per_audio_second (hibari, synthetic): steps are not measured, the initial
    capacity is the limit."""
    adm = Admission(_config(initial_capacity=2), tokens_per_audio_second=None)
    _run_steps(adm, 500)
    assert adm.model.num_samples == 0 and adm.capacity() == 2


def test_admits_while_headroom_remains_then_queues_and_recovers_when_streams_end() -> None:
    """Queue policy: streams are admitted up to capacity; the next ones wait; when speaking
    streams end, waiting ones are admitted in arrival order, with their waits reported."""
    clock = FakeClock()
    adm = _measured(_config(max_wait_s=10.0), clock=clock)
    cap = adm.capacity()
    assert cap is not None
    assert all(adm.request(k).verdict == "admit" for k in range(cap))
    assert adm.demand == cap
    assert [adm.request(k).verdict for k in (1001, 1002, 1003)] == ["queue"] * 3
    assert adm.num_queued == 3
    assert adm.poll() == ([], [])  # no room yet
    clock.t += 0.25
    adm.release(0)
    adm.release(1)
    admitted, refused = adm.poll()
    assert admitted == [1001, 1002] and refused == []
    assert adm.demand == cap and adm.num_queued == 1
    snap = adm.snapshot()
    assert snap["admitted_after_wait"] == 2 and snap["waits_s"] == [0.25, 0.25]
    assert snap["queued"] == 1 and snap["capacity"] == cap and snap["demand"] == cap
    assert adm.snapshot()["waits_s"] == []  # reported once


def test_refuse_policy_refuses_past_capacity_with_a_retry_hint() -> None:
    """Refuse policy: the stream past capacity is refused at once (code capacity, a retry
    hint in the message and as a figure); after one ends, the next is admitted."""
    clock = FakeClock()
    adm = Admission(_config(policy="refuse", initial_capacity=2), tokens_per_audio_second=None,
                    clock=clock)
    assert adm.request(1).verdict == adm.request(2).verdict == "admit"
    clock.t += 8.0
    adm.release(1)  # spoke 8 s: streams leave every ~8 s / 1 stream speaking
    adm.request(3)
    d = adm.request(4)
    assert d.verdict == "refuse" and d.reason == "capacity"
    assert d.retry_after_s == pytest.approx(4.0)  # 8 s per stream / 2 speaking
    assert "retry after 4.0 s" in d.message
    adm.release(2)
    assert adm.request(4).verdict == "admit"
    assert adm.snapshot()["refused_capacity"] == 1


def test_the_queue_is_bounded_in_length_and_in_wait() -> None:
    """Past max_queue a stream is refused (queue_full); one that waited max_wait_s is refused
    by poll (queue_timeout); one expected to wait longer than that is refused at once
    (queue_wait)."""
    clock = FakeClock()
    adm = Admission(_config(initial_capacity=1, max_queue=2, max_wait_s=0.5),
                    tokens_per_audio_second=None, clock=clock)
    assert adm.request(1).verdict == "admit"
    assert adm.request(2).verdict == adm.request(3).verdict == "queue"
    full = adm.request(4)
    assert (full.verdict, full.reason) == ("refuse", "queue_full")
    assert adm.next_timeout_s() == pytest.approx(0.5)
    clock.t += 0.5
    admitted, refused = adm.poll()
    assert admitted == [] and [(k, d.reason) for k, d in refused] == [(2, "queue_timeout"), (3, "queue_timeout")]
    assert adm.next_timeout_s() is None
    clock.t += 9.5
    adm.release(1)  # a stream speaks 10 s: the next room is expected in 10 s
    adm.request(5)
    late = adm.request(6)
    assert (late.verdict, late.reason) == ("refuse", "queue_wait")
    assert late.retry_after_s == pytest.approx(10.0)


def test_off_admits_every_stream_and_still_measures() -> None:
    """Policy off: today's behaviour (no queue, no refusal) with the figures still reported."""
    adm = _measured(_config(policy="off", initial_capacity=1))
    cap = adm.capacity()
    assert all(adm.request(k).verdict == "admit" for k in range(cap + 50))  # type: ignore[operator]
    snap = adm.snapshot()
    assert snap["demand"] == cap + 50 and snap["policy"] == "off" and snap["is_measured"]  # type: ignore[operator]
    assert snap["step_base_ms"] == pytest.approx(3.2, rel=0.05)


def test_an_idle_engine_admits_one_stream_even_at_capacity_zero() -> None:
    """A device too slow for one stream in real time still serves one at a time."""
    adm = _measured(_config(policy="refuse"), scale=10.0)
    assert adm.capacity() == 0
    assert adm.request(1).verdict == "admit"
    assert adm.request(2).verdict == "refuse"


def test_a_queued_stream_that_goes_frees_its_place() -> None:
    """A waiting stream cancelled (released) leaves the queue; the one behind moves up."""
    adm = Admission(_config(initial_capacity=1), tokens_per_audio_second=None)
    adm.request(1)
    adm.request(2)
    adm.request(3)
    adm.release(2)
    adm.release(1)
    assert adm.poll()[0] == [3]
    adm.release(99)  # unknown: nothing happens


def test_config_is_validated() -> None:
    """Bad settings name the setting."""
    for kw, word in ((dict(policy="maybe"), "policy"), (dict(max_queue=-1), "max_queue"),
                     (dict(max_wait_s=-1.0), "max_wait_s"), (dict(headroom=1.0), "headroom"),
                     (dict(initial_capacity=-1), "initial_capacity"), (dict(min_samples=0), "min_samples"),
                     (dict(decode_cap_budget=1.5), "decode_cap_budget"),
                     (dict(decode_cap_budget=-0.5), "decode_cap_budget"),
                     (dict(decode_cap_budget=float("nan")), "decode_cap_budget")):
        with pytest.raises(ValueError, match=word):
            AdmissionConfig(**kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tokens_per_audio_second"):
        Admission(tokens_per_audio_second=0.0)


def test_room_is_what_request_would_still_admit_or_queue() -> None:
    """``room`` (reported to the gateway, which refuses at its door once the streams it sent
    since have taken it) counts exactly the further requests that are admitted or queued before
    the first refusal: with places free, with the queue's wait limit once streams have ended,
    under the refuse policy; None with no limit known or the policy off."""
    def first_refusal(adm: Admission, start: int) -> int:
        n = 0
        while adm.request(start + n).verdict != "refuse":
            n += 1
        return n

    clock = FakeClock()
    for policy, wait in (("refuse", 0.2), ("queue", 0.2), ("queue", 5.0)):
        adm = Admission(AdmissionConfig(policy=policy, initial_capacity=10, max_wait_s=wait,
                                        max_queue=50), clock=clock)
        # idle: its capacity, and the queue while no stream has ended (no wait known yet)
        assert adm.room() == (10 if policy == "refuse" else 60)
        for key in range(7):
            adm.request(key)
        expected = adm.room()
        assert expected == first_refusal(adm, 100)
        assert adm.room() == 0 and adm.snapshot()["room"] == 0
        for key in range(4):  # streams speak 10 s each, then end: the queue's wait is known
            clock.t += 10.0
            adm.release(key)
            adm.poll()
        expected = adm.room()
        assert expected == first_refusal(adm, 200), (policy, wait)
    assert Admission(AdmissionConfig(policy="off", initial_capacity=10)).room() is None
    assert Admission(AdmissionConfig()).room() is None  # not measured, no initial capacity
    snap = Admission(AdmissionConfig(policy="refuse", initial_capacity=3)).snapshot()
    assert snap["room"] == 3 and snap["retry_after_s"] > 0


def test_the_job_slots_seat_one_stream_each() -> None:
    """A backend that runs 300 jobs at once (``--max-num-seqs``): at most 300 streams are
    admitted whatever the step times allow (500 here), one slot each for its spoken segment
    (a segment generated ahead may wait for one), and the refusal names the slots; without
    slots nothing changes."""
    free = Admission(AdmissionConfig(policy="refuse"), tokens_per_audio_second=6.25, clock=FakeClock())
    slots = Admission(AdmissionConfig(policy="refuse"), tokens_per_audio_second=6.25, job_slots=300,
                      clock=FakeClock())
    assert free.seats() is None and slots.seats() == 300 and slots.capacity() == 300  # unmeasured too
    for adm in (free, slots):
        for key in range(100):
            adm.request(key)
        for i in range(3000):  # steps that take 1 ms whatever their rows: room for 500+ streams
            adm.observe_step(1 + i % 200, 0, 0.001, max_rows=0, fill_rows=0, jobs=200)
    assert free.capacity() > 500  # type: ignore[operator]
    assert slots.seats() == 300 and slots.capacity() == 300
    for key in range(100, 300):
        assert slots.request(key).verdict == "admit"
    refused = slots.request(300)
    assert refused.verdict == "refuse" and "300 job slots" in refused.message
    assert slots.snapshot()["job_slots"] == 300 and free.snapshot()["job_slots"] == 0
    with pytest.raises(ValueError, match="job_slots"):
        Admission(job_slots=-1)
