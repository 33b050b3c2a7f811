"""Cartesia's ``/tts/websocket`` contexts, ``/tts/bytes`` and ``/tts/sse`` with the official ``cartesia`` client, against the real server."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest
from cartesia import BadRequestError, Cartesia, PermissionDeniedError
from websockets.exceptions import InvalidStatus

from benchmark.asr import INTELLIGIBILITY_SENTENCES, normalize_words
from tests.conftest import VoxgateServer
from tests.gateway.compat.conftest import API_KEY, assert_intelligible, decode, mulaw, s16

pytestmark = pytest.mark.slow

TEXT = " ".join(INTELLIGIBILITY_SENTENCES[0:2])
LONG = " ".join(INTELLIGIBILITY_SENTENCES[3:9])
VOICE = {"mode": "id", "id": "694f9389-aac1-45b6-b726-9d9369183238"}  # a Cartesia voice id
S16_16K = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 16000}


def _client(server: VoxgateServer, key: str = API_KEY) -> Cartesia:
    return Cartesia(api_key=key, base_url=f"http://127.0.0.1:{server.port}",
                    websocket_base_url=f"ws://127.0.0.1:{server.port}", max_retries=0)


def _pieces(text: str) -> list[str]:
    """The text in pieces of a few words, with the spaces between them (as Cartesia asks)."""
    words = text.split(" ")
    return [" ".join(words[i:i + 3]) + ("" if i + 3 >= len(words) else " ")
            for i in range(0, len(words), 3)]


def _float32(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<f4")


def test_context_streams_audio_and_word_timestamps(compat_server: VoxgateServer) -> None:
    """Text in pieces with add_timestamps: the audio at the rate asked, words in order that are the transcript's, times inside the audio, done last."""
    with _client(compat_server).tts.websocket_connect() as conn:
        ctx = conn.context("turn-1", model_id="sonic-2", voice=VOICE, output_format=S16_16K,
                           add_timestamps=True)
        for piece in _pieces(TEXT):
            ctx.push(piece)
        ctx.no_more_inputs()
        events = list(ctx.receive())
    assert events[-1].type == "done" and all(e.context_id == "turn-1" for e in events)
    audio = s16(b"".join(e.audio or b"" for e in events if e.type == "chunk"))
    assert_intelligible(audio, 16000, TEXT)
    words, starts, ends = [], [], []
    for e in events:
        if e.type == "timestamps":
            words += e.word_timestamps.words
            starts += e.word_timestamps.start
            ends += e.word_timestamps.end
    assert normalize_words(" ".join(words)) == normalize_words(TEXT)
    assert starts == sorted(starts) and all(s <= e for s, e in zip(starts, ends))
    assert ends[-1] <= len(audio) / 16000 + 0.05


def test_two_contexts_cancel_one_the_other_is_whole(compat_server: VoxgateServer) -> None:
    """Two contexts on one socket (f32 and μ-law): cancelling one mid-audio sends nothing more for it; the other comes whole and intelligible."""
    f32 = {"container": "raw", "encoding": "pcm_f32le", "sample_rate": 24000}
    ulaw = {"container": "raw", "encoding": "pcm_mulaw", "sample_rate": 8000}
    with _client(compat_server).tts.websocket_connect() as conn:
        for piece in _pieces(TEXT):
            conn.send({"context_id": "a", "model_id": "sonic-2", "voice": VOICE,
                       "output_format": f32, "transcript": piece, "continue": True})
        for piece in _pieces(LONG):
            conn.send({"context_id": "b", "model_id": "sonic-2", "voice": VOICE,
                       "output_format": ulaw, "transcript": piece, "continue": True})
        conn.send({"context_id": "a", "model_id": "sonic-2", "voice": VOICE,
                   "output_format": f32, "transcript": "", "continue": False})
        events: list[Any] = []
        while True:  # until b's first chunk: then cancel it
            events.append(conn.recv())
            if events[-1].type == "chunk" and events[-1].context_id == "b":
                break
        conn.send({"context_id": "b", "cancel": True})
        conn.send({"context_id": "c", "model_id": "sonic-2", "voice": VOICE,
                   "output_format": ulaw, "transcript": "Hello.", "continue": False})
        done: set[str] = set()
        after_c: list[str] = []
        while done != {"a", "c"}:
            event = conn.recv()
            events.append(event)
            if event.type == "done":
                done.add(event.context_id)
            if event.context_id == "c" or after_c:
                after_c.append(event.context_id)
    assert "b" not in after_c  # nothing for b once the server has read its cancel
    assert not any(e.type in ("done", "error") and e.context_id == "b" for e in events)
    audio_a = _float32(b"".join(e.audio or b"" for e in events
                                if e.type == "chunk" and e.context_id == "a"))
    assert_intelligible(audio_a, 24000, TEXT)
    audio_c = mulaw(b"".join(e.audio or b"" for e in events
                             if e.type == "chunk" and e.context_id == "c"))
    assert audio_c.size > 2000


def test_flush_done_follows_the_flushed_audio(compat_server: VoxgateServer) -> None:
    """flush: true gets flush_done (flush_id 1) after the audio of the text before it and before done; the rest is spoken after."""
    first, second = INTELLIGIBILITY_SENTENCES[0], INTELLIGIBILITY_SENTENCES[1]
    with _client(compat_server).tts.websocket_connect() as conn:
        ctx = conn.context("f", model_id="sonic-2", voice=VOICE, output_format=S16_16K)
        ctx.push(first + " ", flush=True)
        ctx.push(second)
        ctx.no_more_inputs()
        events = list(ctx.receive())
    kinds = [e.type for e in events]
    i = kinds.index("flush_done")
    assert events[i].flush_id == 1 and kinds.count("flush_done") == 1
    assert "chunk" in kinds[:i] and "chunk" in kinds[i:] and kinds[-1] == "done"
    before = s16(b"".join(e.audio or b"" for e in events[:i] if e.type == "chunk"))
    after = s16(b"".join(e.audio or b"" for e in events[i:] if e.type == "chunk"))
    assert_intelligible(before, 16000, first)
    assert_intelligible(after, 16000, second)


def test_socket_errors_in_cartesia_form(compat_server: VoxgateServer) -> None:
    """A bad output_format is an error event with its context_id, status_code 400, naming the field; the socket goes on; a wrong key is refused at the handshake (403)."""
    with _client(compat_server).tts.websocket_connect() as conn:
        conn.send({"context_id": "x", "model_id": "sonic-2", "voice": VOICE,
                   "output_format": {"container": "raw", "encoding": "pcm_s24le",
                                     "sample_rate": 16000}, "transcript": "Hi."})
        error = conn.recv()
        assert error.type == "error" and error.context_id == "x" and error.status_code == 400
        assert "output_format.encoding" in error.message and "pcm_s16le" in error.message
        conn.send({"context_id": "y", "model_id": "sonic-2", "voice": VOICE,
                   "output_format": S16_16K, "transcript": "Hello.", "continue": False})
        kinds = []
        while not kinds or kinds[-1] != "done":
            kinds.append(conn.recv().type)
        assert "chunk" in kinds
    with pytest.raises(InvalidStatus) as info:
        with _client(compat_server, key="wrong").tts.websocket_connect() as conn:
            conn.recv()
    assert info.value.response.status_code == 403
    assert b'"error_code"' in info.value.response.body


def test_rest_bytes_and_sse(compat_server: VoxgateServer) -> None:
    """/tts/bytes in WAV and MP3 and /tts/sse with timestamps are the sentence; bad formats and keys get Cartesia's errors."""
    client = _client(compat_server)
    for fmt in ({"container": "wav", "encoding": "pcm_s16le", "sample_rate": 44100},
                {"container": "mp3", "bit_rate": 128000, "sample_rate": 44100}):
        data = client.tts.generate(model_id="sonic-2", transcript=TEXT, voice=VOICE,
                                   output_format=fmt).read()
        audio, rate = decode(data)
        assert rate == 44100
        assert_intelligible(audio, rate, TEXT)
    events = list(client.tts.generate_sse(model_id="sonic-2", transcript=TEXT, voice=VOICE,
                                          output_format=S16_16K, add_timestamps=True))
    assert events[-1].type == "done"
    audio = s16(b"".join(base64.b64decode(e.data) for e in events
                         if e.type == "chunk"))
    assert_intelligible(audio, 16000, TEXT)
    words = [w for e in events if e.type == "timestamps" for w in e.word_timestamps.words]
    assert normalize_words(" ".join(words)) == normalize_words(TEXT)
    with pytest.raises(BadRequestError) as info:
        client.tts.generate(model_id="sonic-2", transcript=TEXT, voice=VOICE,
                            output_format={"container": "raw", "encoding": "pcm_s16le",
                                           "sample_rate": 44000})
    assert info.value.body["error_code"] == "unsupported_format"
    assert "sample_rate" in info.value.body["message"]
    with pytest.raises(PermissionDeniedError):
        _client(compat_server, key="wrong").tts.generate(
            model_id="sonic-2", transcript=TEXT, voice=VOICE, output_format=S16_16K).read()
