"""Tests for engine.synthetic: the deterministic tone/noise backend and its real-time pacing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.backend import JobOutput, OptionError
from engine.messages import VoiceRef
from engine.synthetic import SyntheticBackend


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run_to_end(backend: SyntheticBackend, max_steps: int = 10_000) -> list[JobOutput]:
    out: list[JobOutput] = []
    for _ in range(max_steps):
        if not backend.has_work():
            return out
        out += backend.step()
    raise AssertionError("backend did not finish")


def audio_of(outputs: list[JobOutput], job_id: int) -> np.ndarray:
    parts = [o.pcm for o in outputs if o.job_id == job_id and o.pcm is not None]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def test_duration_is_proportional_to_text_length() -> None:
    """ms_per_char of audio per (stripped) character, halved at speed 2."""
    backend = SyntheticBackend(ms_per_char=50.0, sample_rate=24_000)
    backend.add_job(1, "x" * 20, "tone", {"speed": 1.0, "seed": 0})
    backend.add_job(2, "  " + "x" * 20 + " ", "noise", {"speed": 2.0, "seed": 0})
    out = run_to_end(backend)
    assert audio_of(out, 1).size == 24_000  # 20 chars * 50 ms
    assert audio_of(out, 2).size == 12_000


def test_chunks_are_bounded_float32_in_range() -> None:
    """Every chunk is float32 in [-1, 1] and at most chunk_ms long."""
    backend = SyntheticBackend(chunk_ms=40.0)
    backend.add_job(1, "hello world", "tone", {"speed": 1.0, "seed": 0})
    backend.add_job(2, "hello world", "noise", {"speed": 1.0, "seed": 3})
    for o in run_to_end(backend):
        if o.pcm is not None:
            assert o.pcm.dtype == np.float32
            assert 0 < o.pcm.size <= 960
            assert np.abs(o.pcm).max() <= 1.0


def test_exactly_one_finished_output_per_job() -> None:
    """Each job ends once, including a job with no audio (whitespace text)."""
    backend = SyntheticBackend()
    for job_id, text in enumerate(["a b c", "   ", "a longer piece of text"], start=1):
        backend.add_job(job_id, text, "tone", {"speed": 1.0, "seed": 0})
    out = run_to_end(backend)
    assert sorted(o.job_id for o in out if o.is_finished) == [1, 2, 3]
    last_index = {o.job_id: i for i, o in enumerate(out)}
    assert all(out[last_index[j]].is_finished for j in (1, 2, 3))


def test_output_is_deterministic() -> None:
    """Same text, voice, seed and job id give the same samples."""
    runs = []
    for _ in range(2):
        backend = SyntheticBackend()
        backend.add_job(7, "some text here", "noise", {"speed": 1.0, "seed": 42})
        runs.append(audio_of(run_to_end(backend), 7))
    np.testing.assert_array_equal(runs[0], runs[1])


def test_unpaced_step_emits_one_chunk_per_job() -> None:
    """Without pacing, one step advances every running job by one chunk."""
    backend = SyntheticBackend(chunk_ms=10.0)
    backend.add_job(1, "abcdefgh", "tone", {"speed": 1.0, "seed": 0})
    backend.add_job(2, "abcdefgh", "tone", {"speed": 1.0, "seed": 0})
    out = backend.step()
    assert [o.job_id for o in out] == [1, 2]
    assert backend.next_due_s() == 0.0


def test_realtime_releases_chunks_only_when_due() -> None:
    """Paced: chunk k is released once k * chunk_ms have passed since the job was added."""
    clock = FakeClock()
    backend = SyntheticBackend(chunk_ms=100.0, ms_per_char=100.0, realtime=True, clock=clock)
    backend.add_job(1, "abcde", "tone", {"speed": 1.0, "seed": 0})  # 500 ms, 5 chunks
    assert [o.pcm.size for o in backend.step()] == [2400]  # chunk 0 is due at once
    assert backend.step() == []
    assert backend.next_due_s() == pytest.approx(0.1)
    clock.now += 0.05
    assert backend.step() == []
    assert backend.next_due_s() == pytest.approx(0.05)
    clock.now += 0.05
    assert len(backend.step()) == 1
    clock.now += 0.25  # the loop was late: every due chunk comes out, nothing more
    assert len(backend.step()) == 2
    clock.now += 0.1
    last = backend.step()
    assert len(last) == 1 and last[0].is_finished
    assert not backend.has_work()
    assert backend.next_due_s() == math.inf


def test_realtime_total_audio_matches_wall_time() -> None:
    """Under pacing, audio released by time t never exceeds t plus one chunk."""
    clock = FakeClock()
    backend = SyntheticBackend(chunk_ms=40.0, realtime=True, clock=clock)
    backend.add_job(1, "x" * 50, "tone", {"speed": 1.0, "seed": 0})  # 3 s
    released = 0
    start = clock.now
    while backend.has_work():
        released += sum(o.pcm.size for o in backend.step() if o.pcm is not None)
        assert released / 24_000 <= clock.now - start + 0.040 + 1e-9
        clock.now += 0.013
    assert released == 72_000


def test_abort_is_idempotent_and_stops_output() -> None:
    """After abort_job no output for that job appears; aborting twice or unknown ids is fine."""
    backend = SyntheticBackend()
    backend.add_job(1, "a long enough text", "tone", {"speed": 1.0, "seed": 0})
    backend.add_job(2, "another text", "tone", {"speed": 1.0, "seed": 0})
    backend.step()
    backend.abort_job(1)
    backend.abort_job(1)
    backend.abort_job(99)
    assert all(o.job_id == 2 for o in run_to_end(backend))


def test_fail_marker_raises_inside_step_once() -> None:
    """A job with the marker makes step raise before any other job advances; then it goes on."""
    backend = SyntheticBackend(ms_per_char=10.0)
    backend.add_job(1, "fine", "tone", {"speed": 1.0, "seed": 0})
    backend.add_job(2, "boom [[fail]]", "tone", {"speed": 1.0, "seed": 0})
    with pytest.raises(RuntimeError):
        backend.step()
    out = run_to_end(backend)
    assert {o.job_id for o in out} == {1}
    assert audio_of(out, 1).size == 960  # none of job 1's audio was lost


def test_fail_mode_error_returns_job_error() -> None:
    """fail_mode='error' ends only the failing job, with a model_error."""
    backend = SyntheticBackend(fail_on=lambda text: text.startswith("bad"), fail_mode="error")
    backend.add_job(1, "bad text", "tone", {"speed": 1.0, "seed": 0})
    backend.add_job(2, "good text", "tone", {"speed": 1.0, "seed": 0})
    out = run_to_end(backend)
    errors = [o for o in out if o.error is not None]
    assert [(o.job_id, o.error.code) for o in errors] == [(1, "model_error")]
    assert any(o.job_id == 2 and o.is_finished for o in out)


def test_validate_fills_defaults() -> None:
    """No voice or options gives the default voice, speed 1 and seed 0."""
    assert SyntheticBackend().validate(None, {}) == ("tone", {"speed": 1.0, "seed": 0})


@pytest.mark.parametrize(
    ("voice", "options", "code", "needle"),
    [
        ("robot", {}, "unknown_voice", "tone, noise"),
        ("tone", {"speed": 3.0}, "invalid_option", "speed"),
        ("tone", {"speed": "fast"}, "invalid_option", "[0.5, 2.0]"),
        ("tone", {"seed": -1}, "invalid_option", "seed"),
        ("tone", {"seed": 1.5}, "invalid_option", "seed"),
        ("tone", {"pitch": 2}, "invalid_option", "pitch"),
    ],
)
def test_validate_rejects_bad_input(voice: str, options: dict, code: str, needle: str) -> None:
    """Bad voices and options raise OptionError naming the field and range."""
    with pytest.raises(OptionError, match=None) as info:
        SyntheticBackend().validate(voice, options)
    assert info.value.code == code
    assert needle in str(info.value)


@pytest.mark.parametrize("kwargs", [{"chunk_ms": 0}, {"ms_per_char": 0}, {"fail_mode": "x"}])
def test_invalid_constructor_arguments(kwargs: dict) -> None:
    """Constructor arguments are validated with ValueError."""
    with pytest.raises(ValueError):
        SyntheticBackend(**kwargs)


def test_tone_chunks_match_the_sine_formula() -> None:
    """Tone chunks (views of a per-frequency table) equal sin(2 pi f t) sample for sample."""
    backend = SyntheticBackend(chunk_ms=40.0, ms_per_char=100.0)
    text = "x" * 25  # 2.5 s: crosses the table's one-second period twice
    backend.add_job(1, text, "tone", {"speed": 1.0, "seed": 0})
    pcm = audio_of(run_to_end(backend), 1)
    f = 180 + sum(map(ord, text)) % 120
    t = np.arange(pcm.size) / 24_000
    np.testing.assert_allclose(pcm, 0.25 * np.sin(2 * np.pi * f * t), atol=1e-6)


def test_realtime_many_jobs_each_paced_on_its_own() -> None:
    """Paced jobs added at different times each release chunk k at t_added + k * chunk."""
    clock = FakeClock()
    backend = SyntheticBackend(chunk_ms=100.0, ms_per_char=100.0, realtime=True, clock=clock)
    backend.add_job(1, "abc", "tone", {"speed": 1.0, "seed": 0})  # chunks at 0, .1, .2
    clock.now += 0.05
    backend.add_job(2, "abc", "tone", {"speed": 1.0, "seed": 0})  # chunks at .05, .15, .25
    released: list[tuple[int, float]] = []
    start = 100.0
    while backend.has_work():
        released += [(o.job_id, round(clock.now - start, 3)) for o in backend.step()]
        clock.now += 0.01
    assert [t for j, t in released if j == 1] == [0.05, 0.1, 0.2]  # job 1's first waited for the step
    assert [t for j, t in released if j == 2] == [0.05, 0.15, 0.25]


def test_realtime_abort_then_reused_id_is_paced_from_its_own_start() -> None:
    """An aborted paced job leaves nothing due; a new job with its id starts its own pacing."""
    clock = FakeClock()
    backend = SyntheticBackend(chunk_ms=100.0, ms_per_char=100.0, realtime=True, clock=clock)
    backend.add_job(1, "abcde", "tone", {"speed": 1.0, "seed": 0})
    backend.add_job(2, "abcde", "tone", {"speed": 1.0, "seed": 0})
    assert len(backend.step()) == 2
    backend.abort_job(1)
    clock.now += 0.1
    assert [o.job_id for o in backend.step()] == [2]
    clock.now += 0.05
    backend.add_job(1, "abcde", "tone", {"speed": 1.0, "seed": 0})
    assert [o.job_id for o in backend.step()] == [1]  # its chunk 0, due at once
    clock.now += 0.06
    assert [o.job_id for o in backend.step()] == [2]  # job 1's next is due 0.1 s after it began
    assert backend.next_due_s() == pytest.approx(0.04)


def _wav(path: object, rate: int = 16000) -> VoiceRef:
    import hashlib
    import wave

    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(b"\x01\x00" * rate)
    sha = hashlib.sha256(open(str(path), "rb").read()).hexdigest()
    return VoiceRef("v-1", str(path), rate, sha, None)


def test_cloning_accepts_a_matching_wav_and_speaks_it_in_its_own_pitch(tmp_path: object) -> None:
    """With clone_voices a voice ref whose file matches becomes a usable voice; the job's tone
    differs from a built-in voice's."""
    backend = SyntheticBackend(clone_voices=True)
    assert backend.info.supports_cloning
    ref = _wav(tmp_path / "v.wav")  # type: ignore[operator]
    name = backend.prepare_voice(ref)
    voice, options = backend.validate(name, {})
    assert voice == "v-1" and options == {"speed": 1.0, "seed": 0}
    backend.add_job(1, "Hello there.", voice, options)
    backend.add_job(2, "Hello there.", "tone", options)
    out = run_to_end(backend)
    a = np.concatenate([o.pcm for o in out if o.job_id == 1 and o.pcm is not None])
    b = np.concatenate([o.pcm for o in out if o.job_id == 2 and o.pcm is not None])
    assert len(a) == len(b) and not np.array_equal(a, b)


def test_cloning_refuses_a_missing_or_altered_file(tmp_path: object) -> None:
    """A voice ref whose file is gone or does not match its sha256 raises OptionError."""
    backend = SyntheticBackend(clone_voices=True)
    ref = _wav(tmp_path / "v.wav")  # type: ignore[operator]
    with pytest.raises(OptionError, match="does not match"):
        backend.prepare_voice(VoiceRef(ref.voice_id, ref.path, ref.sample_rate, "00" * 32, None))
    with pytest.raises(OptionError, match="cannot be read"):
        backend.prepare_voice(VoiceRef("v-2", ref.path + ".gone", 16000, ref.sha256, None))
    assert not SyntheticBackend().info.supports_cloning
