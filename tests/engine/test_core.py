"""EngineCore: streams -> segments -> jobs -> ordered audio, driven in-process."""

from __future__ import annotations

import numpy as np
import pytest

from engine import messages as m
from engine.core import CoreConfig, EngineCore
from tests.engine.fakes import CloningFakeBackend, FakeBackend


def _run(core: EngineCore, max_steps: int = 100) -> list[m.Message]:
    out: list[m.Message] = []
    for _ in range(max_steps):
        if not core.has_work():
            break
        out.extend(core.step())
    return out


def _core(**kw: object) -> tuple[EngineCore, FakeBackend]:
    backend = FakeBackend(**kw)  # type: ignore[arg-type]
    return EngineCore(backend, CoreConfig(first_segment_min_chars=5, min_segment_chars=10,
                                          max_segment_chars=60)), backend


def test_open_validates_voice_and_options() -> None:
    """An unknown voice or bad option fails the open with the backend's code."""
    core, _ = _core()
    assert core.open(1, "zzz", {}) == [m.Error(1, "unknown_voice", "unknown voice 'zzz'; voices: a, b", False)]
    out = core.open(2, None, {"seed": "x"})
    assert isinstance(out[0], m.Error) and out[0].code == "invalid_option"
    assert core.open(3, None, {}) == [m.Started(3, "a", {"seed": 0})]
    assert isinstance(core.open(3, None, {})[0], m.Error)


def test_open_with_a_voice_ref_uses_the_voice_the_backend_prepared() -> None:
    """A registered voice goes through prepare_voice; its name is validated and used."""
    backend = CloningFakeBackend()
    core = EngineCore(backend)
    ref = m.VoiceRef("v-1", "/data/v-1.wav", 44100, "ab" * 32, None)
    assert core.open(1, "ignored", {"seed": 3}, "pcm_s16le", ref) == [m.Started(1, "v-1", {"seed": 3})]
    assert backend.prepared == [ref]
    bad = core.open(2, None, {}, "pcm_s16le", m.VoiceRef("bad-1", "/x.wav", 16000, "cd", None))
    assert bad == [m.Error(2, "voice_unavailable", "voice 'bad-1' cannot be read", False)]


def test_open_with_a_voice_ref_on_a_backend_that_cannot_clone_fails_that_stream() -> None:
    """Without prepare_voice the stream fails with cloning_unsupported, naming the built-in voices."""
    core, _ = _core()
    out = core.open(1, None, {}, "pcm_s16le", m.VoiceRef("v-1", "/v.wav", 24000, "ab", None))
    assert out == [m.Error(1, "cloning_unsupported", "model fake cannot clone voices; use one "
                           "of its built-in voices: a, b", False)]
    assert core.num_streams == 0 and core.open(1, None, {}) == [m.Started(1, "a", {"seed": 0})]


def test_text_end_produces_audio_then_done() -> None:
    """Text and end give audio chunks with the segment span, then one Done(end)."""
    core, backend = _core()
    core.open(1, None, {})
    core.add_text(1, "Hello there, my friend. How are you today?")
    out = core.end(1) + _run(core)
    audio = [x for x in out if isinstance(x, m.Audio)]
    done = [x for x in out if isinstance(x, m.Done)]
    assert audio and len(done) == 1 and out[-1] is done[0]
    assert done[0].reason == "end"
    assert done[0].samples == sum(len(a.pcm) // 4 for a in audio)
    text = "Hello there, my friend. How are you today?"
    spoken = [text[s:e] for s, e in dict.fromkeys(a.span for a in audio)]
    assert " ".join(x.strip() for x in spoken).split() == text.split()
    assert len(backend.added) == len(spoken)


def test_segments_spoken_in_order_with_lookahead() -> None:
    """With lookahead, later segments generate early but their audio waits its turn."""
    core, backend = _core(chunks_per_job=3)
    core.open(1, None, {})
    core.add_text(1, "First part here. Second part here. Third part here. ")
    core.end(1)
    assert len(backend.order) == 2  # head + one lookahead job
    out = _run(core)
    spans = [a.span for a in out if isinstance(a, m.Audio)]
    assert spans == sorted(spans)
    assert isinstance(out[-1], m.Done)


def test_cancel_aborts_jobs_and_stops_audio() -> None:
    """Cancel aborts the stream's jobs at once; no audio for it follows."""
    core, backend = _core(chunks_per_job=5)
    core.open(1, None, {})
    core.open(2, None, {})
    core.add_text(1, "A long sentence for stream one. ")
    core.add_text(2, "A long sentence for stream two. ")
    core.step()
    out = core.cancel(1)
    assert out[0].reason == "cancelled"  # type: ignore[union-attr]
    assert backend.aborted
    rest = core.end(2) + _run(core)
    assert all(getattr(x, "key", 2) == 2 for x in rest)
    assert isinstance(rest[-1], m.Done) and rest[-1].key == 2


def test_job_error_fails_only_that_stream() -> None:
    """A model error fails its stream with an Error; the other stream finishes."""
    core, _ = _core()
    core.open(1, None, {})
    core.open(2, None, {})
    core.add_text(1, "please [[fail]] now. ")
    core.add_text(2, "This one is fine. ")
    out = core.end(1) + core.end(2) + _run(core)
    errors = [x for x in out if isinstance(x, m.Error)]
    assert [(e.key, e.code) for e in errors] == [(1, "model_error")]
    assert [x.key for x in out if isinstance(x, m.Done)] == [2]


def test_empty_stream_ends_with_zero_samples() -> None:
    """End without text gives Done at once with zero samples."""
    core, _ = _core()
    core.open(1, None, {})
    out = core.end(1)
    assert len(out) == 1 and isinstance(out[0], m.Done) and out[0].samples == 0


def test_audio_encoded_in_the_stream_format() -> None:
    """pcm_s16le streams get clipped 16-bit samples; unknown formats are refused."""
    core, _ = _core()
    core.open(1, None, {}, "pcm_s16le")
    core.add_text(1, "Hello world. ")
    out = core.end(1) + _run(core)
    pcm = next(x for x in out if isinstance(x, m.Audio)).pcm
    assert np.frombuffer(pcm, dtype="<i2").tolist() == [8191] * 240  # 0.25 * 32767
    [err] = core.open(2, None, {}, "mp3")
    assert isinstance(err, m.Error) and err.code == "unsupported_format"


def test_audio_is_float32_little_endian() -> None:
    """Audio bytes decode as float32 samples equal to what the backend produced."""
    core, _ = _core()
    core.open(1, None, {})
    core.add_text(1, "Hello world. ")
    out = core.end(1) + _run(core)
    pcm = next(x for x in out if isinstance(x, m.Audio)).pcm
    assert np.allclose(np.frombuffer(pcm, dtype="<f4"), 0.25)


class _DeadlineRecorder(FakeBackend):
    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.deadlines: dict[int, list[float]] = {}
        self.first_audio: dict[int, list[bool]] = {}

    def set_deadline(self, job_id: int, deadline_s: float, first_audio: bool = False) -> None:
        self.deadlines.setdefault(job_id, []).append(deadline_s)
        self.first_audio.setdefault(job_id, []).append(first_audio)


class _Clock:
    def __init__(self) -> None:
        self.t = 10.0

    def __call__(self) -> float:
        return self.t


def _three_segments(chunks_per_job: int) -> tuple:
    """A stream of three segments on a deadline-recording backend (100 ms chunks) at 10.0 s:
    (backend, clock, core, the head job's id, the id of the job generated ahead)."""
    backend = _DeadlineRecorder(chunks_per_job=chunks_per_job, chunk_samples=2400)
    clock = _Clock()
    core = EngineCore(backend, CoreConfig(first_segment_min_chars=5, min_segment_chars=10,
                                          max_segment_chars=60, first_audio_budget_s=0.15,
                                          lookahead_slack_s=1.0), clock=clock)
    core.open(1, None, {})
    core.add_text(1, "First part here. Second part here. Third part here. ")
    first, second = (job_id for job_id, _ in backend.added[:2])
    return backend, clock, core, first, second


def test_deadlines_first_audio_playing_lookahead() -> None:
    """First audio is due within the budget; a playing head when its audio runs out; lookahead
    later, and moved on with the head's (a stale early deadline would let it crowd out spoken
    segments)."""
    backend, clock, core, first, second = _three_segments(chunks_per_job=2)
    assert backend.deadlines[first] == [pytest.approx(10.15)]
    assert backend.deadlines[second] == [pytest.approx(11.15)]
    assert backend.first_audio[first] == [True] and backend.first_audio[second] == [False]  # a target; the ahead's not
    clock.t = 10.05
    core.step()  # first chunk (0.1 s) of the head: its next audio is due when that has played
    assert backend.deadlines[first][-1] == pytest.approx(10.05 + 0.1)
    assert backend.first_audio[first][-1] is False  # playing now
    assert backend.deadlines[second][-1] == pytest.approx(10.05 + 0.1 + 1.0)  # kept after the head's
    core.step()  # the head finishes; the lookahead job, promoted, releases its held chunk
    assert backend.deadlines[second][-1] == pytest.approx(10.05 + 0.3)  # 3 chunks sent


def test_a_segment_ahead_of_a_stream_that_is_behind_is_due_a_slack_from_now() -> None:
    """When the stream's audio so far would have played out already (the client is starved),
    the segment ahead is due one slack from now, not one slack after that past moment: it
    cannot help the starved head, so it must not outrank other streams' heads."""
    backend, clock, core, first, second = _three_segments(chunks_per_job=3)
    clock.t = 10.05
    core.step()  # first chunk at 10.05: played out by 10.15
    clock.t = 10.60  # the next chunk comes late: the client ran dry at 10.15
    core.step()
    assert backend.deadlines[first][-1] == pytest.approx(10.05 + 0.2)  # the head: in the past, most urgent
    assert backend.deadlines[second][-1] == pytest.approx(10.60 + 1.0)  # not 10.25 + 1.0


class _RampBackend(FakeBackend):
    """Distinct samples per job and chunk, some beyond [-1, 1], so mixed-up or misclipped
    bytes would show."""

    def step(self) -> list:  # type: ignore[override]
        out = super().step()
        for o in out:
            if o.pcm is not None:
                o.pcm[:] = np.linspace(-1.5, 1.5, o.pcm.size, dtype=np.float32) * (o.job_id % 3 + 1) / 3
        return out


def test_a_steps_audio_of_mixed_formats_is_encoded_chunk_by_chunk() -> None:
    """Streams of both formats in one step: each Audio holds exactly its own chunk's bytes."""
    backend = _RampBackend(chunks_per_job=2, chunk_samples=100)
    core = EngineCore(backend, CoreConfig(lookahead_jobs=0))
    formats = {1: "pcm_s16le", 2: "pcm_f32le", 3: "pcm_s16le", 4: "pcm_f32le"}
    for key, fmt in formats.items():
        core.open(key, None, {}, fmt)
        core.add_text(key, "Hello world. ")
        core.end(key)
    captured = []
    step = backend.step
    backend.step = lambda: captured.extend(step()) or captured[-4:]  # type: ignore[method-assign]
    out = core.step()
    audio = [x for x in out if isinstance(x, m.Audio)]
    assert [a.key for a in audio] == [1, 2, 3, 4]
    owner = {job_id: key for key, job_id in zip(formats, sorted(o.job_id for o in captured))}
    for a, result in zip(audio, captured):
        assert owner[result.job_id] == a.key
        if formats[a.key] == "pcm_f32le":
            assert a.pcm == result.pcm.astype("<f4").tobytes()
        else:  # the format's definition: round toward zero of clip(x, -1, 1) * 32767
            expected = np.clip(result.pcm.astype(np.float64), -1, 1) * 32767
            assert np.frombuffer(a.pcm, "<i2").tolist() == expected.astype(np.int64).tolist()


def test_flushed_follows_the_flushed_texts_last_audio() -> None:
    """Each flush is acknowledged (Flushed, numbered) after the audio of all text before it,
    before the audio of text sent after it; a flush with nothing pending is acknowledged at once."""
    core, _ = _core(chunks_per_job=3)
    core.open(1, None, {})
    assert core.flush(1) == [m.Flushed(1, 1)]  # nothing said yet
    core.add_text(1, "First part here, and more")
    out = core.flush(1)
    assert not any(isinstance(x, m.Flushed) for x in out)
    core.add_text(1, "Second part comes after the flush.")
    out += core.end(1) + _run(core)
    kinds = [type(x).__name__ for x in out]
    i = kinds.index("Flushed")
    assert out[i] == m.Flushed(1, 2) and kinds.count("Flushed") == 1
    flushed_chars = len("First part here, and more")
    assert out[:i] and all(isinstance(x, m.Audio) and x.span[1] <= flushed_chars for x in out[:i])
    assert all(x.span[0] >= flushed_chars for x in out[i + 1:] if isinstance(x, m.Audio))
    assert kinds[-1] == "Done" and "Audio" in kinds[i + 1:]


def test_no_flushed_after_cancel() -> None:
    """A cancelled stream's pending flush is never acknowledged."""
    core, _ = _core(chunks_per_job=3)
    core.open(1, None, {})
    core.add_text(1, "Some words to speak now")
    core.flush(1)
    core.step()
    out = core.cancel(1) + _run(core)
    assert not any(isinstance(x, m.Flushed) for x in out)


class _ReusedBufferBackend(FakeBackend):
    """Each step's audio is a view of one buffer that the next step overwrites (a backend may
    hand out its own buffer: ``JobOutput.pcm`` holds only until its next step)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.buffer = np.zeros((8, self.chunk_samples), dtype=np.float32)
        self.num_steps = 0

    def step(self) -> list:  # type: ignore[override]
        out = super().step()
        self.num_steps += 1
        for i, o in enumerate(out):
            if o.pcm is not None:
                self.buffer[i] = self.num_steps / 10 + o.job_id / 100  # this step's, this job's value
                o.pcm = self.buffer[i]
        return out


def test_held_audio_of_a_segment_ahead_survives_the_backends_next_step() -> None:
    """Audio of a segment generated ahead waits in the core while the head speaks; the backend
    reuses its buffer meanwhile, and the held chunk still comes out with its own samples."""
    backend = _ReusedBufferBackend(chunks_per_job=2, chunk_samples=50)
    core = EngineCore(backend, CoreConfig(first_segment_min_chars=5, min_segment_chars=10, max_segment_chars=60))
    core.open(1, None, {}, "pcm_f32le")
    core.add_text(1, "First part here. Second part here. ")
    core.end(1)
    chunks = [np.frombuffer(a.pcm, "<f4") for a in _run(core) if isinstance(a, m.Audio)]
    assert [job_id for job_id, _ in backend.added] == [1, 2, 3]
    # step 1: job 1's first chunk sent, job 2's (ahead) held; step 2: job 1's last, then job 2's
    # held chunk (made at step 1: 0.1 + 2 / 100, its buffer row since overwritten) and its last
    assert [round(float(c[0]), 4) for c in chunks] == [0.11, 0.21, 0.12, 0.22, 0.33, 0.43]
    assert all(np.all(c == c[0]) for c in chunks)


def test_pcm_encoding_is_exact_as_steps_grow_and_shrink() -> None:
    """The core encodes into buffers it keeps between steps: a small step after a large one,
    float64 chunks and samples past [-1, 1] still give each chunk exactly its own bytes."""
    from engine.core import _PcmEncoder

    enc = _PcmEncoder()
    rng = np.random.default_rng(3)
    for sizes in ((4000, 3000), (7, 1, 5), (2400,), (9000, 10)):
        pcms = [rng.uniform(-1.5, 1.5, n).astype(np.float64 if n % 2 else np.float32) for n in sizes]
        for fmt in ("pcm_s16le", "pcm_f32le"):
            got = enc.encode(fmt, pcms)
            for data, pcm in zip(got, pcms):
                if fmt == "pcm_f32le":
                    assert data == pcm.astype("<f4").tobytes()
                else:  # round toward zero of clip(x, -1, 1) * 32767, as float32
                    scaled = np.clip(pcm.astype(np.float32) * np.float32(32767.0), -32767, 32767)
                    assert data == scaled.astype("<i2").tobytes()
