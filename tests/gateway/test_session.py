"""gateway.session: the per-connection protocol state machine, without sockets."""

from __future__ import annotations

import itertools
import json

import msgpack
import numpy as np
import pytest

from engine import messages as em
from gateway import protocol as p
from gateway.session import Close, Session, ToClient, ToEngine

HELLO = em.Hello("fake", ["a", "b"], "a", 24000, {})
LIMITS = {"max_streams_per_connection": 2, "max_text_chars_per_stream": 20,
          "max_frame_bytes": 1 << 20, "idle_timeout_s": 60}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _session(ready: bool = True) -> tuple[Session, Clock]:
    keys = itertools.count(1)
    clock = Clock()
    return Session(hello=HELLO, limits=LIMITS, allocate_key=lambda: next(keys),
                   is_engine_ready=lambda: ready, clock=clock), clock


def _send(s: Session, **msg: object) -> list:
    return s.receive_frame(msgpack.packb(msg))


def _client(actions: list) -> list[dict]:
    return [a.msg for a in actions if isinstance(a, ToClient)]


def _engine(actions: list) -> list[em.Message]:
    return [a.msg for a in actions if isinstance(a, ToEngine)]


def test_greeting_has_fixed_fields() -> None:
    """hello carries protocol 1, model, voices and sample rate."""
    s, _ = _session()
    g = s.greeting()
    assert (g["type"], g["protocol"], g["model"], g["voices"], g["sample_rate"]) == (
        "hello", 1, "fake", ["a", "b"], 24000)


def test_start_text_end_forwarded_to_engine() -> None:
    """start/text/flush/end become Open/Text/Flush/End for one engine key."""
    s, _ = _session()
    assert _engine(_send(s, type="start", stream="x", voice="b")) == [
        em.Open(1, "b", {}, "pcm_s16le")]
    assert _engine(_send(s, type="text", stream="x", text="Hi")) == [em.Text(1, "Hi")]
    assert _engine(_send(s, type="flush", stream="x")) == [em.Flush(1)]
    assert _engine(_send(s, type="end", stream="x")) == [em.End(1)]


def test_json_text_frames_accepted() -> None:
    """A JSON text frame is parsed like msgpack."""
    s, _ = _session()
    actions = s.receive_frame(json.dumps({"type": "start", "stream": "j"}))
    assert _engine(actions) == [em.Open(1, None, {}, "pcm_s16le")]


@pytest.mark.parametrize("frame,code", [
    (b"\xc1\xc1", "bad_message"),
    ("{not json", "bad_message"),
    (msgpack.packb([1, 2]), "bad_message"),
    (msgpack.packb({"type": "dance", "stream": "x"}), "unknown_type"),
    (msgpack.packb({"type": "text", "stream": "nope", "text": "hi"}), "unknown_stream"),
    (msgpack.packb({"type": "start", "stream": "x", "voice": "zzz"}), "unknown_voice"),
    (msgpack.packb({"type": "start", "stream": "x", "format": "mp3"}), "unsupported_format"),
    (msgpack.packb({"type": "start", "stream": ""}), "bad_message"),
    (msgpack.packb({"type": "text", "stream": "x"}), "bad_message"),
])
def test_bad_frames_get_an_error_and_nothing_reaches_the_engine(frame: bytes | str, code: str) -> None:
    """Malformed or invalid frames are answered with an error of the right code."""
    s, _ = _session()
    actions = s.receive_frame(frame)
    assert _engine(actions) == []
    [err] = _client(actions)
    assert err["type"] == "error" and err["code"] == code and err["retryable"] is False


def test_unknown_voice_lists_voices() -> None:
    """The unknown-voice message names the served voices."""
    s, _ = _session()
    [err] = _client(_send(s, type="start", stream="x", voice="zzz"))
    assert "'a'" in err["message"] and "'b'" in err["message"]


def test_too_many_streams_is_retryable() -> None:
    """A start beyond the per-connection limit fails retryably; others are untouched."""
    s, _ = _session()
    _send(s, type="start", stream="1")
    _send(s, type="start", stream="2")
    [err] = _client(_send(s, type="start", stream="3"))
    assert err["code"] == "too_many_streams" and err["retryable"] is True
    assert s.num_active_streams == 2


def test_duplicate_stream_id_rejected() -> None:
    """start with an active id is a stream_exists error."""
    s, _ = _session()
    _send(s, type="start", stream="1")
    assert _client(_send(s, type="start", stream="1"))[0]["code"] == "stream_exists"


def test_text_too_long_ends_the_stream() -> None:
    """Past the text limit the stream gets text_too_long and is cancelled in the engine."""
    s, _ = _session()
    _send(s, type="start", stream="x")
    _send(s, type="text", stream="x", text="a" * 15)
    actions = _send(s, type="text", stream="x", text="b" * 10)
    assert _engine(actions) == [em.Cancel(1)]
    assert _client(actions)[0]["code"] == "text_too_long"
    assert s.num_active_streams == 0


def test_text_after_end_rejected() -> None:
    """text after end is a stream_ended error."""
    s, _ = _session()
    _send(s, type="start", stream="x")
    _send(s, type="end", stream="x")
    assert _client(_send(s, type="text", stream="x", text="more"))[0]["code"] == "stream_ended"


def test_engine_not_ready_is_retryable() -> None:
    """While the engine restarts, start fails with engine_unavailable (retryable)."""
    s, _ = _session(ready=False)
    [err] = _client(_send(s, type="start", stream="x"))
    assert err["code"] == "engine_unavailable" and err["retryable"]


def test_audio_numbered_with_span_text() -> None:
    """Engine audio (already s16le) goes out with seq, offset in samples, span and the span's text."""
    s, clock = _session()
    _send(s, type="start", stream="x")
    _send(s, type="text", stream="x", text="Hello world")
    pcm = np.array([16383, -16383, 32767], dtype="<i2").tobytes()
    clock.t += 0.05
    [a0] = _client(s.on_engine(em.Audio(1, pcm, (0, 5), 0.0)))
    [a1] = _client(s.on_engine(em.Audio(1, pcm, (0, 5), 0.0)))
    assert a0["pcm"] == pcm
    assert (a0["seq"], a0["offset"], a0["span"], a0["text"]) == (0, 0, [0, 5], "Hello")
    assert (a1["seq"], a1["offset"], "text" in a1) == (1, 3, False)
    [done] = _client(s.on_engine(em.Done(1, "end", 6, {})))
    assert done["reason"] == "end" and done["samples"] == 6
    assert done["ttfa_ms"] == pytest.approx(50.0)


def test_f32_format_passes_through() -> None:
    """pcm_f32le streams get the engine's float32 bytes unchanged."""
    s, _ = _session()
    _send(s, type="start", stream="x", format="pcm_f32le")
    pcm = np.array([0.1, 0.2], dtype="<f4").tobytes()
    assert _client(s.on_engine(em.Audio(1, pcm, None, 0.0)))[0]["pcm"] == pcm


def test_cancel_sends_done_at_once_and_drops_late_audio() -> None:
    """cancel answers done(cancelled) immediately; later engine audio for it is dropped."""
    s, _ = _session()
    _send(s, type="start", stream="x")
    _send(s, type="start", stream="y")
    actions = _send(s, type="cancel", stream="x")
    assert _engine(actions) == [em.Cancel(1)]
    assert _client(actions)[0]["reason"] == "cancelled"
    assert s.on_engine(em.Audio(1, b"\0\0\0\0", None, 0.0)) == []
    assert _client(s.on_engine(em.Audio(2, b"\0\0\0\0", None, 0.0)))[0]["stream"] == "y"


def test_engine_error_ends_only_that_stream() -> None:
    """An engine Error for one key becomes an error for that stream only."""
    s, _ = _session()
    _send(s, type="start", stream="x")
    _send(s, type="start", stream="y")
    [err] = _client(s.on_engine(em.Error(1, "invalid_option", "top_p must be in (0, 1]", False)))
    assert (err["stream"], err["code"]) == ("x", "invalid_option")
    assert s.num_active_streams == 1


def test_a_capacity_refusal_carries_its_retry_hint() -> None:
    """An engine `capacity` Error reaches the client with retry_after_s; other errors have none."""
    s, _ = _session()
    _send(s, type="start", stream="x")
    _send(s, type="start", stream="y")
    [err] = _client(s.on_engine(em.Error(1, "capacity", "server at capacity; retry after 2.5 s", True, 2.5)))
    assert (err["code"], err["retryable"], err["retry_after_s"]) == ("capacity", True, 2.5)
    [err] = _client(s.on_engine(em.Error(2, "model_error", "boom", False)))
    assert "retry_after_s" not in err


def test_the_door_hears_of_every_stream_that_frees_a_place() -> None:
    """With the gateway's door (gateway.admission_door): a stream that ends or fails counts as a
    place freed (the crowd's hint divides by that rate), a capacity refusal as a refusal, whose
    hint and message the door may lengthen; a start the door refuses never reaches the engine."""
    from gateway.admission_door import AdmissionDoor

    class Door(AdmissionDoor):
        def __init__(self) -> None:
            super().__init__(lambda: None)
            self.left, self.hints = 0, []
            self.full: float | None = None

        def check(self) -> float | None:
            return self.full

        def stream_left(self) -> None:
            self.left += 1

        def refused(self, engine_hint_s: float | None) -> float:
            self.hints.append(engine_hint_s)
            return 7.5

    door = Door()
    keys = itertools.count(1)
    s = Session(hello=HELLO, limits=LIMITS, allocate_key=lambda: next(keys), is_engine_ready=lambda: True,
                door=door)
    for sid in ("a", "b"):  # (two streams a connection)
        _send(s, type="start", stream=sid)
    s.on_engine(em.Done(1, "end", 0))
    s.on_engine(em.Error(2, "model_error", "boom", False))
    _send(s, type="start", stream="c")
    [err] = _client(s.on_engine(em.Error(3, "capacity", "server at capacity: full; retry after 0.1 s", True, 0.1)))
    assert door.left == 2 and door.hints == [0.1]
    assert err["retry_after_s"] == 7.5 and err["message"] == "server at capacity: full; retry after 7.5 s"
    door.full = 3.0
    actions = _send(s, type="start", stream="d")
    assert _engine(actions) == []
    [err] = _client(actions)
    assert (err["code"], err["retryable"], err["retry_after_s"]) == ("capacity", True, 3.0)


def test_done_says_how_long_a_stream_waited_for_admission() -> None:
    """An engine Done whose timings have queue_wait_ms passes it on in `done`."""
    s, _ = _session()
    _send(s, type="start", stream="x")
    [done] = _client(s.on_engine(em.Done(1, "end", 0, {"queue_wait_ms": 212.3456, "ttfa_ms": 250.0})))
    assert done["queue_wait_ms"] == 212.346
    _send(s, type="start", stream="y")
    [done] = _client(s.on_engine(em.Done(2, "end", 0, {"ttfa_ms": 30.0})))
    assert "queue_wait_ms" not in done


def test_engine_lost_fails_all_streams_retryably() -> None:
    """When the engine dies every active stream gets engine_restarted (retryable)."""
    s, _ = _session()
    _send(s, type="start", stream="x")
    _send(s, type="start", stream="y")
    errs = _client(s.on_engine_lost())
    assert sorted(e["stream"] for e in errs) == ["x", "y"]
    assert all(e["code"] == "engine_restarted" and e["retryable"] for e in errs)
    assert s.num_active_streams == 0


def test_close_cancels_everything_in_the_engine() -> None:
    """A closed connection cancels its streams in the engine."""
    s, _ = _session()
    _send(s, type="start", stream="x")
    assert _engine(s.close()) == [em.Cancel(1)]


def test_a_registered_voice_is_resolved_into_the_open() -> None:
    """A start naming a registered voice (not a built-in one) opens with its VoiceRef; the
    greeting says whether the model clones; a built-in name never reaches the resolver."""
    ref = em.VoiceRef("v-1", "/data/voices/v-1.wav", 44100, "ab" * 32, None)
    asked: list[str] = []

    def resolve(voice: str) -> em.VoiceRef | None:
        asked.append(voice)
        return ref if voice in ("v-1", "Alice") else None

    hello = em.Hello("fake", ["a", "b"], "a", 24000, {}, "", supports_cloning=True)
    s = Session(hello=hello, limits=LIMITS, allocate_key=itertools.count(1).__next__,
                is_engine_ready=lambda: True, resolve_voice=resolve)
    assert s.greeting()["supports_cloning"] is True
    assert _engine(_send(s, type="start", stream="x", voice="Alice")) == [
        em.Open(1, "Alice", {}, "pcm_s16le", ref)]
    [err] = _client(_send(s, type="start", stream="z", voice="nobody"))
    assert err["code"] == "unknown_voice" and "registered" in err["message"]
    assert _engine(_send(s, type="start", stream="y", voice="b")) == [em.Open(2, "b", {}, "pcm_s16le")]
    assert asked == ["Alice", "nobody"]


def test_an_ambiguous_registered_name_is_an_unknown_voice_naming_the_ids() -> None:
    """A resolver's LookupError becomes unknown_voice with its message; nothing is opened."""
    def resolve(voice: str) -> em.VoiceRef | None:
        raise LookupError("2 registered voices are named 'Sam'; name one by its id: v-1, v-2")

    s = Session(hello=HELLO, limits=LIMITS, allocate_key=itertools.count(1).__next__,
                is_engine_ready=lambda: True, resolve_voice=resolve)
    actions = _send(s, type="start", stream="x", voice="Sam")
    assert _engine(actions) == [] and s.num_active_streams == 0
    [err] = _client(actions)
    assert err["code"] == "unknown_voice" and "v-1, v-2" in err["message"] and err["stream"] == "x"


def test_stop_accepting_then_shutdown_ends_streams_with_server_shutdown() -> None:
    """While draining a start is refused (retryable); shutdown cancels every live stream in the
    engine and tells its client server_shutdown (retryable)."""
    s, _ = _session()
    _send(s, type="start", stream="x")
    s.stop_accepting("the server is shutting down")
    [refused] = _client(_send(s, type="start", stream="y"))
    assert (refused["code"], refused["retryable"], refused["stream"]) == ("server_shutdown", True, "y")
    actions = s.shutdown("the server is shutting down")
    assert _engine(actions) == [em.Cancel(1)] and s.num_active_streams == 0
    [err] = _client(actions)
    assert (err["code"], err["retryable"], err["stream"]) == ("server_shutdown", True, "x")


# --- hostile frames: each answered with a documented error, and nothing that fails to encode --

DECLARED = em.Hello("fake", ["a"], "a", 24000, {
    "seed": {"type": "int", "min": 0, "max": 2**63 - 1},
    "top_p": {"min": 0.0, "max": 1.0, "min_inclusive": False},
})


def _declared_session() -> Session:
    keys = itertools.count(1)
    return Session(hello=DECLARED, limits=LIMITS, allocate_key=lambda: next(keys),
                   is_engine_ready=lambda: True)


def _encodable(actions: list) -> list:
    """Every action's payload encodes as it will be sent (client maps in both encodings)."""
    for a in actions:
        if isinstance(a, ToEngine):
            assert em.decode(em.encode(a.msg)) == a.msg
        elif isinstance(a, ToClient):
            for enc in p.Encoding:
                p.decode_server_frame(p.encode_server_message(a.msg, enc))
    return actions


def _error_of(s: Session, frame: bytes | str) -> dict:
    actions = _encodable(s.receive_frame(frame))
    assert _engine(actions) == []
    [err] = _client(actions)
    assert err["type"] == "error"
    return err


@pytest.mark.parametrize("frame", [
    "[" * 1000 + "]" * 1000,
    '{"type": "start", "stream": "x", "options": {"seed": ' + "[" * 5000 + "]" * 5000 + "}}",
    b"\x91" * 5000 + b"\xc0",
], ids=["json-array", "json-in-options", "msgpack"])
def test_deeply_nested_frames_are_bad_messages(frame: bytes | str) -> None:
    """Frames nested past the decoders' depth guard get bad_message, not a RecursionError."""
    s = _declared_session()
    err = _error_of(s, frame)
    assert err["code"] in ("bad_message", "invalid_option") and not err["retryable"]


@pytest.mark.parametrize("field,frame", [
    ("stream", '{"type": "start", "stream": "\\ud800"}'),
    ("stream", b"\x82\xa4type\xa5start\xa6stream\xa3\xed\xa0\x80"),  # msgpack: an encoded surrogate
    ("stream", b"\x82\xa4type\xa3end\xa6stream\xa2\xff\xfe"),  # msgpack: bytes that are not UTF-8
    ("voice", '{"type": "start", "stream": "x", "voice": "a\\udfff"}'),
    ("options", '{"type": "start", "stream": "x", "options": {"\\udc00": 1}}'),
    ("options", '{"type": "start", "stream": "x", "options": {"style": "\\udc00"}}'),
])
def test_lone_surrogates_are_bad_messages_naming_the_field(field: str, frame: bytes | str) -> None:
    """A lone surrogate (JSON escape) or non-UTF-8 bytes (msgpack) is bad_message naming the field."""
    err = _error_of(_declared_session(), frame)
    assert err["code"] == "bad_message" and f"'{field}" in err["message"]


@pytest.mark.parametrize("encoding", list(p.Encoding))
def test_lone_surrogate_in_text_ends_nothing(encoding: p.Encoding) -> None:
    """text with a lone surrogate is refused for that frame; the stream goes on."""
    s = _declared_session()
    _encodable(_send(s, type="start", stream="x"))
    if encoding is p.Encoding.JSON:
        frame: bytes | str = json.dumps({"type": "text", "stream": "x", "text": "hi \ud800"})
    else:
        frame = msgpack.Packer(unicode_errors="surrogatepass").pack(
            {"type": "text", "stream": "x", "text": "hi \ud800"})
    err = _error_of(s, frame)
    assert (err["code"], err["stream"]) == ("bad_message", "x") and "'text'" in err["message"]
    assert _engine(_send(s, type="text", stream="x", text="fine")) == [em.Text(1, "fine")]


@pytest.mark.parametrize("options", [
    '{"seed": %d}' % 2**70,
    '{"seed": %d}' % -(2**70),
    '{"other": %d}' % 2**64,
    '{"seed": %s}' % ("9" * 4000),
    '{"seed": -1}',
    '{"seed": %d}' % 2**63,
    '{"top_p": 0}',
    '{"top_p": 1.5}',
    '{"seed": [1]}',
    '{"seed": {"a": 1}}',
])
def test_options_outside_declared_or_representable_ranges_are_invalid(options: str) -> None:
    """Integers past 64 bits, declared ranges and non-scalar values are invalid_option."""
    frame = '{"type": "start", "stream": "x", "options": %s}' % options
    err = _error_of(_declared_session(), frame)
    assert err["code"] == "invalid_option" and err["stream"] == "x"


def test_options_at_the_declared_bounds_reach_the_engine() -> None:
    """The largest declared seed and an inclusive top_p bound are accepted."""
    s = _declared_session()
    actions = _encodable(_send(s, type="start", stream="x",
                               options={"seed": 2**63 - 1, "top_p": 1.0, "free": 2**64 - 1}))
    assert _engine(actions) == [em.Open(1, None, {"seed": 2**63 - 1, "top_p": 1.0,
                                                  "free": 2**64 - 1}, "pcm_s16le")]


def test_an_unexpected_failure_is_an_internal_error_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug behind receive_frame becomes an `internal` error; the session keeps serving."""
    s = _declared_session()
    monkeypatch.setattr(s, "_dispatch", lambda msg: 1 / 0)
    assert _error_of(s, msgpack.packb({"type": "end", "stream": "x"}))["code"] == "internal"
    monkeypatch.undo()
    assert _engine(_send(s, type="start", stream="x")) == [em.Open(1, None, {}, "pcm_s16le")]


# --- slow consumers and a failed engine ---------------------------------------------------


def test_slow_consumer_cancels_every_stream_errors_and_closes_1008() -> None:
    """on_slow_consumer cancels all streams in the engine, sends slow_consumer, closes 1008."""
    s, _ = _session()
    _send(s, type="start", stream="x")
    _send(s, type="start", stream="y")
    actions = _encodable(s.on_slow_consumer())
    assert sorted(m.key for m in _engine(actions)) == [1, 2]
    assert all(isinstance(m, em.Cancel) for m in _engine(actions))
    [err] = _client(actions)
    assert (err["code"], err["stream"], err["retryable"]) == ("slow_consumer", None, True)
    assert isinstance(actions[-1], Close) and actions[-1].code == 1008
    assert s.num_active_streams == 0
    assert s.on_engine(em.Audio(1, b"\0\0", None, 0.0)) == []
    assert s.receive_frame(msgpack.packb({"type": "start", "stream": "z"})) == []
    assert s.on_slow_consumer() == [] and s.close() == []


def test_final_engine_loss_fails_streams_for_good_and_closes_1011() -> None:
    """After the last allowed restart: engine_failed (not retryable) per stream and for the
    connection, then a 1011 close."""
    s, _ = _session()
    _send(s, type="start", stream="x")
    actions = _encodable(s.on_engine_lost(is_final=True))
    errs = _client(actions)
    assert [(e["stream"], e["code"], e["retryable"]) for e in errs] == [
        ("x", "engine_failed", False), (None, "engine_failed", False)]
    assert isinstance(actions[-1], Close) and actions[-1].code == 1011
    assert s.on_engine_lost(is_final=True) == []


def test_samples_sent_are_counted_when_a_stream_ends() -> None:
    """Each ended stream adds the samples it sent to the metrics (sample accounting)."""
    counted: list[int] = []

    class Metrics:
        observe_ttfa = observe_chunk_gap = count_error = count_stream = lambda self, x: None

        def count_samples_sent(self, n: int) -> None:
            counted.append(n)

    keys = itertools.count(1)
    s = Session(hello=HELLO, limits=LIMITS, allocate_key=lambda: next(keys),
                is_engine_ready=lambda: True, metrics=Metrics())
    _send(s, type="start", stream="x")
    _send(s, type="start", stream="y")
    s.on_engine(em.Audio(1, b"\0\0" * 5, None, 0.0))
    s.on_audio(em.Audio(2, b"\0\0" * 3, None, 0.0))
    s.on_engine(em.Done(1, "end", 5, {}))
    s.close()
    assert counted == [5, 3]
