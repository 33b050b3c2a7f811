"""Tests for models.hibari.backend: hibari-tts behind the Backend contract."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backend import JobOutput, OptionError
from models.hibari import HibariBackend, available_voices

TWO_SENTENCES = "The weather is nice today. We are going to the park."


@pytest.fixture(scope="module")
def backend() -> HibariBackend:
    b = HibariBackend()
    yield b
    b.close()


def run_to_end(backend: HibariBackend, max_steps: int = 1000) -> list[JobOutput]:
    out: list[JobOutput] = []
    for _ in range(max_steps):
        if not backend.has_work():
            return out
        out += backend.step()
    raise AssertionError("backend did not finish")


def add(backend: HibariBackend, job_id: int, text: str, **options: object) -> None:
    voice, opts = backend.validate(None, dict(options))
    backend.add_job(job_id, text, voice, opts)


def test_info_announces_the_embedded_voice(backend: HibariBackend) -> None:
    """The packaged voice 'heart' is the default; audio is 24 kHz."""
    assert backend.info.model == "hibari"
    assert "heart" in backend.info.voices
    assert backend.info.default_voice == "heart"
    assert backend.info.sample_rate == 24_000
    assert set(backend.info.voices) == set(available_voices())


def test_audio_is_float32_in_range_in_chunks_of_at_most_100_ms(backend: HibariBackend) -> None:
    """Chunks are float32 in [-1, 1], non-empty and at most 2400 samples (100 ms)."""
    add(backend, 1, TWO_SENTENCES, seed=0)
    out = run_to_end(backend)
    chunks = [o.pcm for o in out if o.pcm is not None]
    assert len(chunks) > 10
    for pcm in chunks:
        assert pcm.dtype == np.float32
        assert 0 < pcm.size <= 2400
        assert np.abs(pcm).max() <= 1.0
    audio = np.concatenate(chunks)
    assert 2.0 < audio.size / 24_000 < 8.0  # about three seconds of speech
    assert np.sqrt(np.mean(audio**2)) > 0.01  # not silence


def test_steps_are_one_sentence_each(backend: HibariBackend) -> None:
    """A two-sentence job needs two steps; the first step already returns audio."""
    add(backend, 1, TWO_SENTENCES, seed=0)
    first = backend.step()
    assert first and not any(o.is_finished for o in first)
    second = backend.step()
    assert second[-1].is_finished
    assert not backend.has_work()


def test_exactly_one_finished_output_per_job(backend: HibariBackend) -> None:
    """Every job ends once, also one with nothing speakable; its last output is the finish."""
    texts = ["Hello there.", "   ", "One. Two. Three.", "Good night."]
    for job_id, text in enumerate(texts, start=1):
        add(backend, job_id, text, seed=1)
    out = run_to_end(backend)
    finished = [o.job_id for o in out if o.is_finished]
    assert sorted(finished) == [1, 2, 3, 4]
    for job_id in (1, 2, 3, 4):
        assert [o for o in out if o.job_id == job_id][-1].is_finished


def test_jobs_are_served_first_in_first_out(backend: HibariBackend) -> None:
    """All of job 1's audio comes before job 2's."""
    add(backend, 1, "First job.", seed=0)
    add(backend, 2, "Second job.", seed=0)
    assert backend.num_queued() == 1
    order = [o.job_id for o in run_to_end(backend)]
    assert order == sorted(order)


def test_seed_makes_audio_repeatable(backend: HibariBackend) -> None:
    """The same text and seed give bit-identical audio."""
    runs = []
    for job_id in (1, 2):
        add(backend, job_id, "Repeat after me.", seed=7)
        runs.append(np.concatenate([o.pcm for o in run_to_end(backend) if o.pcm is not None]))
    np.testing.assert_array_equal(runs[0], runs[1])


def test_speed_changes_duration(backend: HibariBackend) -> None:
    """speed 2 gives clearly shorter audio than speed 0.5."""
    lengths = []
    for job_id, speed in ((1, 0.5), (2, 2.0)):
        add(backend, job_id, "This sentence is spoken at two speeds.", seed=0, speed=speed)
        lengths.append(sum(o.pcm.size for o in run_to_end(backend) if o.pcm is not None))
    assert lengths[1] < 0.7 * lengths[0]


def test_abort_is_idempotent_and_stops_output(backend: HibariBackend) -> None:
    """After abort_job no output for that job appears; repeated or unknown aborts are fine."""
    add(backend, 1, TWO_SENTENCES, seed=0)
    add(backend, 2, "Other job.", seed=0)
    assert any(o.job_id == 1 for o in backend.step())
    backend.abort_job(1)
    backend.abort_job(1)
    backend.abort_job(12345)
    out = run_to_end(backend)
    assert out and all(o.job_id == 2 for o in out)


def test_chunk_ms_option() -> None:
    """chunk_ms sets the chunk size; out-of-range values are refused."""
    small = HibariBackend(chunk_ms=20.0, warmup=False)
    small.add_job(1, "Short.", "heart", {"speed": 1.0, "seed": 0})
    sizes = [o.pcm.size for o in run_to_end(small) if o.pcm is not None]
    assert max(sizes) == 480
    for bad in (0.0, 250.0):
        with pytest.raises(ValueError, match="chunk_ms"):
            HibariBackend(chunk_ms=bad, warmup=False)


def test_validate_fills_defaults(backend: HibariBackend) -> None:
    """No voice or options: the default voice, speed 1.0, no seed."""
    assert backend.validate(None, {}) == ("heart", {"speed": 1.0, "seed": None})
    assert backend.validate("heart", {"speed": 2, "seed": 3}) == ("heart", {"speed": 2.0, "seed": 3})


@pytest.mark.parametrize(
    ("voice", "options", "code", "needle"),
    [
        ("nobody", {}, "unknown_voice", "heart"),
        ("heart", {"speed": 0.1}, "invalid_option", "[0.5, 2.0]"),
        ("heart", {"speed": "fast"}, "invalid_option", "speed"),
        ("heart", {"speed": True}, "invalid_option", "speed"),
        ("heart", {"seed": -5}, "invalid_option", "seed"),
        ("heart", {"seed": "x"}, "invalid_option", "seed"),
        ("heart", {"temperature": 0.5}, "invalid_option", "temperature"),
    ],
)
def test_validate_rejects_bad_input(
    backend: HibariBackend, voice: str, options: dict, code: str, needle: str
) -> None:
    """Bad voices and options raise OptionError naming the field, range or voices."""
    with pytest.raises(OptionError) as info:
        backend.validate(voice, options)
    assert info.value.code == code
    assert needle in str(info.value)


def test_synthesis_error_fails_that_job_only(backend: HibariBackend, monkeypatch) -> None:
    """An exception while synthesising becomes a model_error for that job; others go on."""
    tts = backend._tts["heart"]
    real = tts.phonemize

    def phonemize(text: str) -> list[str]:
        if "bad" in text:
            raise RuntimeError("injected")
        return real(text)

    monkeypatch.setattr(tts, "phonemize", phonemize)
    add(backend, 1, "bad text", seed=0)
    add(backend, 2, "Good text.", seed=0)
    out = run_to_end(backend)
    assert [(o.job_id, o.error.code) for o in out if o.error] == [(1, "model_error")]
    assert out[-1].job_id == 2 and out[-1].is_finished


def test_earliest_deadline_is_served_first(backend) -> None:
    """A job due sooner is synthesised before an older job due later."""
    voice, options = backend.validate(None, {})
    backend.add_job(1, "This one was generated ahead.", voice, options)
    backend.set_deadline(1, 100.0)
    backend.add_job(2, "Hello there.", voice, options)
    backend.set_deadline(2, 50.0)
    assert {out.job_id for out in backend.step()} == {2}
    backend.abort_job(1)


@pytest.mark.parametrize("text", ["¹:30", "Pay ¹$ now.", "E = mc², ﬁne, １２ apples."])
def test_compatibility_characters_are_read_as_their_plain_forms(backend: HibariBackend, text: str) -> None:
    """Superscripts, ligatures and full-width forms speak (hibari's own number reading failed
    on a superscript it took for a digit: found by the vendor-protocol fuzz)."""
    add(backend, 1, text, seed=0)
    out = run_to_end(backend)
    assert not [o.error for o in out if o.error]
    assert sum(o.pcm.size for o in out if o.pcm is not None) > 0 and out[-1].is_finished
