"""The vendor protocols under Hypothesis against the real server: hostile frames on each vendor's
WebSocket and hostile bodies on its REST routes get the vendor's error or a documented close,
never a server error, and the server logs no exception while it takes them."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from benchmark.fuzz_protocol import hostile_values
from benchmark.fuzz_protocol import frames as native_frames
from tests.conftest import VoxgateServer, assert_no_exception_logged, start_server

pytestmark = pytest.mark.slow

API_KEY = "fuzz-key"
AUTH = {"X-API-Key": API_KEY}
_SETTINGS = settings(max_examples=150, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                            HealthCheck.function_scoped_fixture])
_CLOSE_CODES = {1000, 1008, 1009, 1013}  # normal, policy (auth, limits), too big, try again later
_TIMEOUT_S = 20.0  # a failure guard: every example's sentinel is answered long before


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[VoxgateServer]:
    """A server of its own, so that its whole log can be read once it has stopped."""
    server = start_server("--api-key", API_KEY)
    yield server
    server.stop()
    assert_no_exception_logged(server)


def _either(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(valid, valid, hostile_values)


_text = _either(st.text(max_size=24))
_flag = _either(st.booleans())
_ids = _either(st.sampled_from(["a", "b", ""]))
_formats = _either(st.fixed_dictionaries(
    {"container": _either(st.sampled_from(["raw", "wav", "mp3"])),
     "encoding": _either(st.sampled_from(["pcm_s16le", "pcm_f32le", "pcm_mulaw", "nope"])),
     "sample_rate": _either(st.sampled_from([16000, 24000, 11025]))},
    optional={"bit_rate": _either(st.sampled_from([128000, 1]))}))
_voice_settings = _either(st.fixed_dictionaries(
    {}, optional={"speed": _either(st.floats(0.5, 2.0)), "stability": hostile_values}))

ELEVENLABS = st.fixed_dictionaries({}, optional={
    "text": _text, "flush": _flag, "context_id": _ids, "close_context": _flag,
    "voice_settings": _voice_settings, "generation_config": hostile_values,
    "try_trigger_generation": _flag, "xi_api_key": hostile_values})
CARTESIA = st.fixed_dictionaries({
    "model_id": _either(st.just("sonic-2")), "transcript": _text,
    "voice": _either(st.fixed_dictionaries({"mode": _either(st.just("id")), "id": _either(st.just("x"))})),
    "output_format": _formats}, optional={
    "context_id": _ids, "continue": _flag, "cancel": _flag, "flush": _flag,
    "add_timestamps": _flag, "speed": _either(st.sampled_from(["fast", "slow", 1.0, -1])),
    "generation_config": hostile_values, "language": hostile_values})
DEEPGRAM = st.fixed_dictionaries({"type": _either(st.sampled_from(["Speak", "Flush", "Clear"]))},
                                 optional={"text": _text})


def _frames(shaped: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[list[bytes | str]]:
    """Frames a client of that vendor could send: its messages with hostile values, and any frame."""
    as_json = st.builds(lambda m: json.dumps(m, default=str), shaped)
    return st.lists(st.one_of(as_json, as_json, native_frames), max_size=6)


def _answers(ws: Any, done: Any) -> list[Any]:
    """What the server sends until ``done(message)`` or its close."""
    seen: list[Any] = []
    try:
        while True:
            raw = ws.recv(timeout=_TIMEOUT_S)
            msg = json.loads(raw) if isinstance(raw, str) else raw
            seen.append(msg)
            if done(msg):
                return seen
    except ConnectionClosed:
        assert ws.close_code in _CLOSE_CODES, (ws.close_code, ws.close_reason, seen[-3:])
        return seen


def _socket(server: VoxgateServer, path: str, frames: list[bytes | str], sentinel: list[str],
            done: Any) -> list[Any]:
    with connect(f"ws://127.0.0.1:{server.port}{path}", additional_headers=AUTH,
                 max_size=None, open_timeout=_TIMEOUT_S) as ws:
        try:
            for frame in [*frames, *sentinel]:
                ws.send(frame)
        except ConnectionClosed:  # closed by one of them (a frame too large, close_socket): said why
            pass
        seen = _answers(ws, done)
    for msg in seen:  # text frames are JSON objects
        assert isinstance(msg, (bytes, dict)), msg
    return seen


@_SETTINGS
@given(frames=_frames(ELEVENLABS), multi=st.booleans())
def test_elevenlabs_sockets_answer_any_frames(fuzz_server: VoxgateServer, frames: list[bytes | str],
                                              multi: bool) -> None:
    """Hostile frames on stream-input and multi-stream-input, then close_socket: errors come as
    ElevenLabs error frames, and the socket closes once its contexts are done."""
    path = "multi-stream-input" if multi else "stream-input"
    seen = _socket(fuzz_server, f"/v1/text-to-speech/x/{path}?output_format=pcm_16000", frames,
                   [json.dumps({"close_socket": True})], done=lambda m: False)
    for msg in seen:
        if isinstance(msg, dict) and "error" in msg:
            assert isinstance(msg["error"], str) and isinstance(msg.get("message"), str), msg


@_SETTINGS
@given(frames=_frames(CARTESIA))
def test_cartesia_socket_answers_any_frames(fuzz_server: VoxgateServer, frames: list[bytes | str]) -> None:
    """Hostile frames, then a valid request of its own context: errors are Cartesia error
    events (a status code and a message), and the last request is answered."""
    sentinel = json.dumps({"model_id": "sonic-2", "transcript": "", "context_id": "zz-last",
                           "voice": {"mode": "id", "id": "x"},
                           "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 16000}})
    seen = _socket(fuzz_server, "/tts/websocket", frames, [sentinel],
                   done=lambda m: isinstance(m, dict) and m.get("context_id") == "zz-last" and m.get("done"))
    assert any(isinstance(m, dict) and m.get("context_id") == "zz-last" for m in seen), seen[-3:]
    for msg in seen:
        if isinstance(msg, dict) and msg.get("type") == "error":
            assert isinstance(msg["status_code"], int) and 400 <= msg["status_code"] < 600, msg
            assert msg["status_code"] < 500 or msg.get("title") != "Internal error", msg


@_SETTINGS
@given(frames=_frames(DEEPGRAM))
def test_deepgram_socket_answers_any_frames(fuzz_server: VoxgateServer, frames: list[bytes | str]) -> None:
    """Hostile frames, then Close: errors are Deepgram Warning messages, and the socket closes."""
    seen = _socket(fuzz_server, "/v1/speak?encoding=linear16&sample_rate=16000", frames,
                   [json.dumps({"type": "Close"})], done=lambda m: False)
    for msg in seen:
        if isinstance(msg, dict):
            assert isinstance(msg.get("type"), str), msg


_OPENAI = st.fixed_dictionaries({
    "model": _either(st.just("tts-1")), "input": _text,
    "voice": _either(st.sampled_from(["alloy", "x"]))}, optional={
    "response_format": _either(st.sampled_from(["pcm", "wav", "mp3", "nope"])),
    "speed": _either(st.floats(0.25, 4.0)), "instructions": hostile_values,
    "stream_format": _either(st.sampled_from(["audio", "sse"]))})
_REST = {
    "/v1/audio/speech": _OPENAI,
    "/v1/text-to-speech/x/stream?output_format=pcm_16000": st.fixed_dictionaries({"text": _text}, optional={
        "model_id": hostile_values, "voice_settings": _voice_settings}),
    "/v1/text-to-speech/x?output_format=mp3_44100_128": st.fixed_dictionaries({"text": _text}, optional={
        "model_id": hostile_values, "voice_settings": _voice_settings}),
    "/v1/text-to-speech/x/with-timestamps?output_format=mp3_22050_32": st.fixed_dictionaries(
        {"text": _text}, optional={"voice_settings": _voice_settings, "previous_text": hostile_values}),
    "/v1/text-to-speech/x/stream/with-timestamps?output_format=pcm_22050": st.fixed_dictionaries(
        {"text": _text}, optional={"voice_settings": _voice_settings, "previous_text": hostile_values}),
    "/tts/bytes": CARTESIA,
    "/tts/sse": CARTESIA,
    "/v1/speak?encoding=linear16&sample_rate=16000": st.fixed_dictionaries(
        {}, optional={"text": _text}),
}


@_SETTINGS
@given(path=st.sampled_from(sorted(_REST)), data=st.data(), raw=st.one_of(st.none(), st.binary(max_size=32)))
def test_rest_routes_answer_any_body(fuzz_server: VoxgateServer, path: str, data: st.DataObject,
                                     raw: bytes | None) -> None:
    """Hostile JSON bodies (or bytes) on each vendor's REST route: audio (200), or a client
    error (4xx) with a JSON body; never a server error."""
    body = raw if raw is not None else json.dumps(data.draw(_REST[path]), default=str).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{fuzz_server.port}{path}", data=body,
                                     method="POST", headers={**AUTH, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
            assert response.status == 200
            response.read()
    except urllib.error.HTTPError as err:
        assert 400 <= err.code < 500, (err.code, err.read()[:300])
        json.loads(err.read())
