"""gateway.session with start's ``sample_rate``: the resampled stream's frames, tails and
refusals, without sockets."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import soxr

from engine import messages as em
from gateway.session import Session, _NoMetrics
from tests.gateway.test_session import _client, _engine, _send

HELLO = em.Hello("fake", ["a"], "a", 24000, {})
LIMITS = {"max_streams_per_connection": 4, "max_text_chars_per_stream": 200,
          "max_frame_bytes": 1 << 20, "idle_timeout_s": 60}


class Counted(_NoMetrics):
    """Metrics that keep what ``count_samples_sent`` got."""

    def __init__(self) -> None:
        self.samples_sent: list[int] = []

    def count_samples_sent(self, num_samples: int) -> None:
        self.samples_sent.append(num_samples)


def _session(metrics: Counted | None = None) -> Session:
    keys = itertools.count(1)
    return Session(hello=HELLO, limits=LIMITS, allocate_key=lambda: next(keys),
                   is_engine_ready=lambda: True, metrics=metrics)




def _tone(n: int) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * 220 * np.arange(n) / 24000)).astype(np.float32)  # [n]


def test_a_resampled_stream_asks_the_engine_for_f32_the_others_for_their_format() -> None:
    """sample_rate 16000 opens the engine stream in pcm_f32le (resampled here); no sample_rate,
    or the model's own, opens it in the stream's format and passes its bytes through."""
    s = _session()
    assert _engine(_send(s, type="start", stream="r", sample_rate=16000)) == [
        em.Open(1, None, {}, "pcm_f32le")]
    assert _engine(_send(s, type="start", stream="n")) == [em.Open(2, None, {}, "pcm_s16le")]
    assert _engine(_send(s, type="start", stream="m", sample_rate=24000)) == [
        em.Open(3, None, {}, "pcm_s16le")]
    readies = [_client(s.on_engine(em.Started(k, "a", {})))[0] for k in (1, 2, 3)]
    assert [r["sample_rate"] for r in readies] == [16000, 24000, 24000]
    pcm = np.array([16383, -16383, 7], dtype="<i2").tobytes()
    for key in (2, 3):
        assert _client(s.on_engine(em.Audio(key, pcm, (0, 1), 0.0)))[0]["pcm"] == pcm


def test_resampled_frames_flush_and_end_carry_all_of_soxr_output() -> None:
    """A 16 kHz s16 stream: its frames, the tail at the flush and the tail at the end are soxr's
    resampling of each flushed piece; done counts samples at 16 kHz, the metrics at 24 kHz."""
    metrics = Counted()
    s = _session(metrics)
    _send(s, type="start", stream="x", sample_rate=16000)
    _send(s, type="text", stream="x", text="Hello there. Bye.")
    x = _tone(24000)
    pieces = [x[:9600], x[9600:]]  # the flush comes between them
    frames = []
    for k, piece in enumerate(pieces):
        span = (0, 12) if k == 0 else (13, 17)
        for i in range(0, piece.size, 960):
            frames += _client(s.on_engine(em.Audio(1, piece[i:i + 960].tobytes(), span, 0.0)))
        if k == 0:
            n_before = len(frames)
            frames += _client(s.on_engine(em.Flushed(1, 1)))
            assert len(frames) == n_before + 1  # the tail, as audio
    *audio, done = _client(s.on_engine(em.Done(1, "end", x.size, {})))
    frames += audio
    got = np.concatenate([np.frombuffer(f["pcm"], "<i2") for f in frames])
    ref = np.concatenate([soxr.resample(p, 24000, 16000, quality="HQ") for p in pieces])
    assert got.size == ref.size == 16000
    np.testing.assert_allclose(got / 32767.0, ref, atol=1.5 / 32767)
    assert [f["offset"] for f in frames] == list(np.cumsum([0] + [len(f["pcm"]) // 2
                                                                  for f in frames[:-1]]))
    assert [f.get("text") for f in frames if "text" in f] == ["Hello there.", "Bye."]
    assert done["samples"] == 16000 and done["audio_s"] == pytest.approx(1.0)
    assert metrics.samples_sent == [24000]  # as the engine counts them


def test_a_chunk_the_filter_holds_sends_nothing_and_its_text_comes_with_the_next() -> None:
    """At 8 kHz a first small chunk yields no samples: no empty frame goes out, and the next
    frame carries the segment's text."""
    s = _session()
    _send(s, type="start", stream="x", sample_rate=8000)
    _send(s, type="text", stream="x", text="Hi.")
    x = _tone(960)
    assert s.on_audio(em.Audio(1, x[:480].tobytes(), (0, 3), 0.0)) is None
    frames = []
    for _ in range(4):
        frame = s.on_audio(em.Audio(1, x.tobytes(), (0, 3), 0.0))
        frames += [frame] if frame is not None else []
    assert frames and frames[0]["text"] == "Hi." and frames[0]["seq"] == 0
    assert all(len(f["pcm"]) > 0 for f in frames)


def test_cancel_drops_what_the_resampler_holds() -> None:
    """cancel answers done(cancelled) at once with no audio; the held tail is never sent, and
    the engine's late flush acknowledgement or end sends nothing."""
    s = _session()
    _send(s, type="start", stream="x", sample_rate=48000)
    sent = s.on_audio(em.Audio(1, _tone(2400).tobytes(), None, 0.0))
    assert sent is not None
    actions = _send(s, type="cancel", stream="x")
    assert _engine(actions) == [em.Cancel(1)]
    [done] = _client(actions)
    assert done["reason"] == "cancelled" and done["samples"] == len(sent["pcm"]) // 2 < 4800
    assert s.on_engine(em.Flushed(1, 1)) == [] and s.on_engine(em.Done(1, "end", 2400, {})) == []


@pytest.mark.parametrize("value", [12345, 96000, 1, True, "16000", 16000.5])
def test_a_rate_outside_the_set_is_refused_and_nothing_is_opened(value: object) -> None:
    """unsupported_format names the rates; no Open reaches the engine; the id stays free."""
    s = _session()
    actions = _send(s, type="start", stream="x", sample_rate=value)
    assert _engine(actions) == []
    [err] = _client(actions)
    assert (err["code"], err["stream"], err["retryable"]) == ("unsupported_format", "x", False)
    assert "[8000, 16000, 22050, 24000, 32000, 44100, 48000]" in err["message"]
    assert _engine(_send(s, type="start", stream="x", sample_rate=22050)) == [
        em.Open(1, None, {}, "pcm_f32le")]


def test_with_an_input_streaming_engine_a_flush_does_not_cut_the_resampler() -> None:
    """An engine that takes text while it speaks acknowledges a flush before that flush's audio:
    the resampler is then not drained there, so the audio is one resampling of the whole turn,
    its tail sent at the end."""
    keys = itertools.count(1)
    s = Session(hello=em.Hello("fake", ["a"], "a", 24000, {}, input_streaming=True), limits=LIMITS,
                allocate_key=lambda: next(keys), is_engine_ready=lambda: True)
    _send(s, type="start", stream="x", sample_rate=16000)
    _send(s, type="text", stream="x", text="Hello there. Bye.")
    x = _tone(24000)
    frames = []
    for i in range(0, x.size, 960):
        frames += _client(s.on_engine(em.Audio(1, x[i:i + 960].tobytes(), (0, 17), 0.0)))
        if i == 4800:
            assert _client(s.on_engine(em.Flushed(1, 1))) == []  # acknowledged mid-speech: no tail yet
    *audio, done = _client(s.on_engine(em.Done(1, "end", x.size, {})))
    frames += audio
    got = np.concatenate([np.frombuffer(f["pcm"], "<i2") for f in frames])
    ref = soxr.resample(x, 24000, 16000, quality="HQ")
    assert got.size == ref.size == 16000 and done["samples"] == 16000
    np.testing.assert_allclose(got / 32767.0, ref, atol=1.5 / 32767)
