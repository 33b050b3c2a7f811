"""EngineCore admission: a simulated step-based engine (step time a function of its rows, on a
fake clock) admits streams while headroom remains, queues or refuses past it, and recovers
when streams end."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine import messages as m
from engine.admission import AdmissionConfig
from engine.backend import BackendInfo, JobOutput
from engine.core import CoreConfig, EngineCore

TEXT = "Hello there, a sentence that is long enough."


class FakeClock:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


def step_s(rows: int) -> float:
    """Simulated step time: 2 ms + 1.5 ms a row. At 82 tokens a second per stream and 10%
    headroom, 5 streams fit (78% of the time) and 6 do not (90.2%)."""
    return 0.002 + 0.0015 * rows


class SimBackend:
    """Every job decodes one token a step (a row); 7 tokens make 2,048 samples; a job needs
    two tokens per character. ``input_streaming``: one job per turn, fed by ``push_text``."""

    def __init__(self, clock: FakeClock, *, input_streaming: bool = False) -> None:
        self.info = BackendInfo("sim", ("a",), "a", 24000, input_streaming=input_streaming,
                                tokens_per_audio_second=7 * 24000 / 2048)
        self.clock = clock
        self.left: dict[int, int] = {}  # job -> tokens still to make
        self.final: set[int] = set()  # streaming jobs whose text has all come
        self.added: list[tuple[int, str]] = []  # (job id, its first text), in order
        self.text: dict[int, str] = {}  # job id -> all its text
        self.last_rows = 0

    def validate(self, voice: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return voice or "a", {}

    def add_job(self, job_id: int, text: str, voice: str, options: dict[str, Any]) -> None:
        self.added.append((job_id, text))
        self.text[job_id] = text
        self.left[job_id] = 2 * len(text)
        if not self.info.input_streaming:
            self.final.add(job_id)

    def push_text(self, job_id: int, text: str, *, flush: bool = False, final: bool = False) -> None:
        if job_id in self.left:
            self.left[job_id] += 2 * len(text)
            self.text[job_id] += text
            if final:
                self.final.add(job_id)

    def abort_job(self, job_id: int) -> None:
        self.left.pop(job_id, None)

    def has_work(self) -> bool:
        return bool(self.left)

    def num_queued(self) -> int:
        return 0

    def step(self) -> list[JobOutput]:
        rows = [j for j, n in self.left.items() if n > 0]
        self.last_rows = len(rows)
        self.clock.t += step_s(len(rows)) if rows else 0.001
        out = []
        for job_id in list(self.left):
            if self.left[job_id] > 0:
                self.left[job_id] -= 1
                out.append(JobOutput(job_id, pcm=np.full(292, 0.1, np.float32)))
            if self.left[job_id] == 0 and job_id in self.final:
                del self.left[job_id]
                out.append(JobOutput(job_id, is_finished=True))
        return out

    def close(self) -> None:
        pass


def _core(policy: str = "queue", *, input_streaming: bool = False, max_wait_s: float = 60.0,
          measured: bool = True, lookahead_jobs: int = 0) -> tuple[EngineCore, SimBackend, FakeClock]:
    clock = FakeClock()
    backend = SimBackend(clock, input_streaming=input_streaming)
    core = EngineCore(backend, CoreConfig(lookahead_jobs=lookahead_jobs, first_segment_min_chars=5,
                                          min_segment_chars=10, max_segment_chars=60),
                      admission=AdmissionConfig(policy=policy, max_wait_s=max_wait_s), clock=clock)
    if measured:  # what the engine loop reports after a ramp over 1-20 rows
        for i in range(400):
            rows = 1 + i % 20
            core.note_step(rows, 0, step_s(rows), max_rows=0)
    return core, backend, clock


def _run(core: EngineCore, backend: SimBackend, max_steps: int = 20000) -> list[m.Message]:
    """The engine loop: step, report the step, let waiting streams in."""
    out: list[m.Message] = []
    for _ in range(max_steps):
        if not core.has_work() and not core.admission.num_queued:
            break
        if core.has_work():
            out.extend(core.step())
            core.note_step(backend.last_rows, 0, step_s(backend.last_rows), max_rows=0)
        out.extend(core.poll())
    return out


def _speak(core: EngineCore, key: int, text: str = TEXT) -> list[m.Message]:
    return core.open(key, None, {}) + core.add_text(key, text) + core.end(key)


def _by_key(msgs: list[m.Message], key: int, kind: type) -> list[Any]:
    return [x for x in msgs if isinstance(x, kind) and x.key == key]


def test_refuse_past_capacity_and_admit_again_when_streams_end() -> None:
    """Capacity 5: five streams speak, the sixth and seventh are refused at once (retryable
    `capacity` with a retry hint), and after the five end a new stream is admitted."""
    core, backend, _ = _core("refuse")
    assert core.admission.capacity() == 5
    out: list[m.Message] = []
    for key in range(1, 8):
        out += _speak(core, key)
    errors = [x for x in out if isinstance(x, m.Error)]
    assert [e.key for e in errors] == [6, 7]
    assert all(e.code == "capacity" and e.retryable and e.retry_after_s for e in errors)
    assert "retry after" in errors[0].message
    assert core.admission.demand == 5 and {j for j, _ in backend.added} == {1, 2, 3, 4, 5}
    out = _run(core, backend)
    assert sorted(x.key for x in out if isinstance(x, m.Done)) == [1, 2, 3, 4, 5]
    assert not _by_key(out, 6, m.Audio)  # a refused stream says nothing more
    assert core.admission.demand == 0
    out = _speak(core, 8) + _run(core, backend)
    assert _by_key(out, 8, m.Audio) and _by_key(out, 8, m.Done)


def test_queued_streams_wait_and_are_admitted_in_order_when_room_frees() -> None:
    """Queue policy: streams 6 and 7 wait (no error); each starts only after a speaking stream
    has ended, 6 before 7; their done timings carry the wait, counted in their TTFA."""
    core, backend, _ = _core("queue")
    out: list[m.Message] = []
    for key in range(1, 8):
        out += _speak(core, key)
    assert not any(isinstance(x, m.Error) for x in out)
    assert core.admission.num_queued == 2
    out += _run(core, backend)
    first_done = min(i for i, x in enumerate(out) if isinstance(x, m.Done))
    first_audio = {k: min(i for i, x in enumerate(out) if isinstance(x, m.Audio) and x.key == k)
                   for k in (6, 7)}
    assert first_done < first_audio[6] < first_audio[7]
    for key in (6, 7):
        [done] = _by_key(out, key, m.Done)
        assert done.reason == "end" and done.timings["queue_wait_ms"] > 0
        assert done.timings["ttfa_ms"] >= done.timings["queue_wait_ms"]
    assert "queue_wait_ms" not in _by_key(out, 1, m.Done)[0].timings
    snap = core.admission.snapshot()
    assert snap["admitted_after_wait"] == 2 and len(snap["waits_s"]) == 2


def test_a_stream_waiting_too_long_is_refused() -> None:
    """A queued stream still waiting after max_wait_s is refused with `capacity` by poll;
    ``next_poll_s`` says when."""
    core, backend, clock = _core("queue", max_wait_s=0.2)
    for key in range(1, 7):
        _speak(core, key)
    assert core.next_poll_s() == pytest.approx(0.2)
    clock.t += 0.2
    [err] = core.poll()
    assert isinstance(err, m.Error) and err.key == 6 and err.code == "capacity" and err.retryable
    assert core.next_poll_s() is None
    assert core.admission.snapshot()["refused_queue_timeout"] == 1
    assert 6 not in core.stream_keys() and 6 not in {j for j, _ in backend.added}


def test_a_waiting_stream_can_be_cancelled() -> None:
    """Cancel while waiting: `done` cancelled at once, nothing reached the backend, and the
    stream behind it takes its place in the queue."""
    core, backend, _ = _core("queue")
    for key in range(1, 8):
        _speak(core, key)
    [done] = core.cancel(6)
    assert isinstance(done, m.Done) and done.reason == "cancelled" and "queue_wait_ms" in done.timings
    assert core.admission.num_queued == 1
    out = _run(core, backend)
    assert _by_key(out, 7, m.Done) and not _by_key(out, 6, m.Audio)


def test_text_keeps_coming_while_a_stream_waits() -> None:
    """A waiting stream's later text and its end are kept; once admitted it speaks all of it."""
    core, backend, _ = _core("queue")
    for key in range(1, 6):
        _speak(core, key)
    core.open(6, None, {})
    core.add_text(6, "First words here, ")
    assert core.admission.num_queued == 1
    core.add_text(6, "and the rest of them.")
    core.end(6)
    out = _run(core, backend)
    [done] = _by_key(out, 6, m.Done)
    spoken = " ".join(backend.text.values())
    assert "First words here," in spoken and "and the rest of them." in spoken
    assert done.samples > 0


def test_an_input_streaming_turn_waits_with_its_text() -> None:
    """Input streaming: a queued turn holds its text; admitted, it gets one job with all the
    text so far, then the rest, and its end."""
    core, backend, _ = _core("queue", input_streaming=True)
    for key in range(1, 6):
        _speak(core, key)
    core.open(6, None, {})
    core.add_text(6, "Waiting words, ")
    core.add_text(6, "more words.")
    core.end(6)
    assert core.admission.num_queued == 1 and len(backend.added) == 5
    out = _run(core, backend)
    job6 = backend.added[5][0]
    assert backend.added[5][1] == backend.text[job6] == "Waiting words, more words."
    [done] = _by_key(out, 6, m.Done)
    assert done.samples == 292 * 2 * len("Waiting words, more words.")


def test_policy_off_admits_everyone() -> None:
    """Admission off: every stream is admitted, as before admission existed."""
    core, backend, _ = _core("off")
    out: list[m.Message] = []
    for key in range(1, 9):
        out += _speak(core, key)
    assert not any(isinstance(x, m.Error) for x in out) and core.admission.demand == 8
    out = _run(core, backend)
    assert len([x for x in out if isinstance(x, m.Done)]) == 8


def test_a_stream_without_text_takes_no_capacity() -> None:
    """Opened streams that have sent no text are not speaking: they do not count."""
    core, _, _ = _core("refuse")
    for key in range(1, 20):
        core.open(key, None, {})
    assert core.admission.demand == 0 and core.num_streams == 19
    [done] = core.end(3)
    assert isinstance(done, m.Done) and done.samples == 0


def test_segments_generated_ahead_take_their_rows_of_the_capacity() -> None:
    """A segment generated ahead of each spoken one (lookahead_jobs 1), every job decoding each
    step: the core reports the jobs its streams hold, two a stream, so N streams run 2N rows a
    step and the capacity is 2 (6 rows take 11 ms: 90.2% of the time at 82 tokens a second),
    not 5; a third stream is refused."""
    core, backend, _ = _core("refuse", lookahead_jobs=1)
    assert core.admission.capacity() == 5
    text = "One sentence that is long enough to stand alone. " * 4
    for key in (1, 2):
        _speak(core, key, text)
    for _ in range(64):
        core.step()
        core.note_step(backend.last_rows, 0, step_s(backend.last_rows), max_rows=0)
    assert backend.last_rows == 4
    assert core.admission.jobs_per_stream() == pytest.approx(2.0, rel=0.02)
    assert core.admission.capacity() == 2
    errors = [x for x in _speak(core, 3, text) if isinstance(x, m.Error)]
    assert [(e.key, e.code) for e in errors] == [(3, "capacity")]


class CappedSim(SimBackend):
    """A backend with a decode cap the core may set (``LMBackend.set_decode_cap``)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.max_decode_rows = 64
        self.caps: list[int] = []

    def set_decode_cap(self, rows: int) -> None:
        self.caps.append(rows)
        self.max_decode_rows = rows


@pytest.mark.parametrize("budget", [0.0, 0.8])
def test_the_measured_decode_cap_reaches_the_backend(budget: float) -> None:
    """With ``decode_cap_budget`` the core sets the backend's cap from the measured step times
    (2 ms + 1.5 ms a row against 12.2 ms of audio a token: 80% of it holds 5 rows), as the fit
    settles, not at every step; with it off the backend's own cap stands."""
    clock = FakeClock()
    backend = CappedSim(clock)
    core = EngineCore(backend, CoreConfig(), admission=AdmissionConfig(decode_cap_budget=budget), clock=clock)
    for i in range(400):
        rows = 1 + i % 20
        core.note_step(rows, 0, step_s(rows), max_rows=backend.max_decode_rows)
    if budget:
        assert backend.caps[-1] == 5 and len(backend.caps) <= 3 and backend.max_decode_rows == 5
        assert core.admission.max_rows_per_step == 5  # the capacity estimate counts the new cap
    else:
        assert backend.caps == [] and backend.max_decode_rows == 64


@pytest.mark.parametrize(("asked", "model_default", "applied"), [(-1.0, 0.8, 0.8), (-1.0, 0.0, 0.0),
                                                                 (0.0, 0.8, 0.0), (0.5, 0.8, 0.5)])
def test_the_decode_cap_budget_is_the_models_unless_given(asked: float, model_default: float, applied: float) -> None:
    """``decode_cap_budget`` -1 (the default) takes the backend's ``default_decode_cap_budget``
    (an LM program's, engine.llm.build); 0 or a fraction given stands. The model's 0.8 caps
    the rows as a given 0.8 does (5 rows for these steps)."""
    clock = FakeClock()
    backend = CappedSim(clock)
    backend.default_decode_cap_budget = model_default
    core = EngineCore(backend, CoreConfig(), admission=AdmissionConfig(decode_cap_budget=asked), clock=clock)
    assert core.admission.config.decode_cap_budget == applied
    for i in range(400):
        rows = 1 + i % 20
        core.note_step(rows, 0, step_s(rows), max_rows=backend.max_decode_rows)
    assert (backend.caps[-1] if backend.caps else None) == {0.8: 5, 0.5: 2, 0.0: None}[applied]
    assert EngineCore(SimBackend(clock), CoreConfig(), clock=clock).admission.config.decode_cap_budget == 0.0


def test_the_backends_job_slots_bound_the_streams_admitted() -> None:
    """A backend with 2 job slots (``LMBackend.job_slots``): two streams take them, so a third
    is refused with ``capacity`` though the step times leave room for five, and the refusal
    names the slots; once one ends a new stream is admitted."""
    clock = FakeClock()
    backend = SimBackend(clock)
    backend.job_slots = 2  # type: ignore[attr-defined]
    core = EngineCore(backend, CoreConfig(first_segment_min_chars=5, min_segment_chars=10, max_segment_chars=60),
                      admission=AdmissionConfig(policy="refuse"), clock=clock)
    assert core.admission.job_slots == 2 and core.admission.capacity() == 2
    for key in (1, 2):
        assert not [x for x in _speak(core, key) if isinstance(x, m.Error)]
    errors = [x for x in _speak(core, 3) if isinstance(x, m.Error)]
    assert [(e.key, e.code) for e in errors] == [(3, "capacity")] and "2 job slots" in errors[0].message
    out = _run(core, backend)
    assert sorted(x.key for x in out if isinstance(x, m.Done)) == [1, 2]
    assert not [x for x in _speak(core, 4) if isinstance(x, m.Error)]
