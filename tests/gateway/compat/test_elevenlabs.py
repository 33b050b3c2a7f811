"""ElevenLabs' stream-input and multi-stream-input WebSockets and REST routes, with the official ``elevenlabs`` client where it has one, against the real server."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from elevenlabs.client import ElevenLabs
from elevenlabs.core.api_error import ApiError
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from benchmark.asr import INTELLIGIBILITY_SENTENCES
from tests.conftest import VoxgateServer
from tests.gateway.compat.conftest import (API_KEY, TlsTerminator, assert_intelligible, decode,
                                           s16)

pytestmark = pytest.mark.slow

TEXT = " ".join(INTELLIGIBILITY_SENTENCES[0:2])
LONG = " ".join(INTELLIGIBILITY_SENTENCES[3:9])
VOICE = "21m00Tcm4TlvDq8ikWAM"  # an ElevenLabs voice id ("Rachel")


def _client(base_url: str, key: str = API_KEY) -> ElevenLabs:
    return ElevenLabs(api_key=key, base_url=base_url)


def test_stream_input_with_the_sdk_over_tls(compat_server: VoxgateServer,
                                            tls_terminator: TlsTerminator,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """convert_realtime (which insists on wss: a local TLS terminator here) streams a sentence sent word by word back at the rate asked."""
    monkeypatch.setenv("SSL_CERT_FILE", tls_terminator.ca_file)
    client = _client(f"https://127.0.0.1:{tls_terminator.port}")
    chunks = list(client.text_to_speech.convert_realtime(
        VOICE, text=iter(word + " " for word in TEXT.split(" ")),
        model_id="eleven_flash_v2_5", output_format="pcm_16000"))
    assert len(chunks) > 1
    assert_intelligible(s16(b"".join(chunks)), 16000, TEXT)


def _multi(server: VoxgateServer, output_format: str = "pcm_24000") -> Any:
    return connect(f"ws://127.0.0.1:{server.port}/v1/text-to-speech/{VOICE}/multi-stream-input"
                   f"?model_id=eleven_flash_v2_5&output_format={output_format}&auto_mode=true",
                   additional_headers={"xi-api-key": API_KEY})


def _send(ws: Any, **frame: Any) -> None:
    ws.send(json.dumps(frame))


def _words(ws: Any, context_id: str, text: str) -> None:
    for word in text.split(" "):
        _send(ws, text=word + " ", context_id=context_id)


def test_multi_stream_contexts_final_once_and_barge_in(compat_server: VoxgateServer) -> None:
    """Two contexts: a (flush, close_context) gets all its audio then isFinal exactly once; b closed with unflushed text is cut off with nothing more; keep-alives and plain flushes send nothing."""
    with _multi(compat_server) as ws:
        _send(ws, text=" ", context_id="a", voice_settings={"speed": 1.0, "stability": 0.5})
        _send(ws, text=" ", context_id="b")
        _words(ws, "b", LONG)
        _send(ws, context_id="b", flush=True)
        _words(ws, "a", TEXT)
        _send(ws, text="")  # a keep-alive: no context, nothing happens
        _send(ws, context_id="a", flush=True)
        _send(ws, text="", context_id="a")  # a keep-alive for a
        frames: list[dict[str, Any]] = []
        while True:  # b's first audio: then barge in with text it never flushed
            frames.append(json.loads(ws.recv()))
            if frames[-1].get("contextId") == "b" and frames[-1].get("audio"):
                break
        _send(ws, text="and more words", context_id="b")
        _send(ws, context_id="b", close_context=True)
        _send(ws, context_id="a", close_context=True)
        _send(ws, text=" Hello. ", context_id="c")
        _send(ws, context_id="c", flush=True)
        _send(ws, context_id="c", close_context=True)
        finals: list[str] = []
        after_c: list[str] = []
        while set(finals) != {"a", "c"}:
            frame = json.loads(ws.recv())
            frames.append(frame)
            if frame.get("isFinal") is True:
                finals.append(frame["contextId"])
            if frame.get("contextId") == "c" or after_c:
                after_c.append(frame.get("contextId"))
        _send(ws, close_socket=True)
        rest = list(ws)
        assert ws.close_code == 1000 and rest == []
    assert sorted(finals) == ["a", "c"]  # once each; none for b
    assert "b" not in after_c
    a_frames = [f for f in frames if f.get("contextId") == "a"]
    assert a_frames[-1] == {"isFinal": True, "contextId": "a"}
    assert all(f.get("isFinal") is not True for f in a_frames[:-1])
    audio_a = b"".join(base64.b64decode(f["audio"]) for f in a_frames if f.get("audio"))
    assert_intelligible(s16(audio_a), 24000, TEXT)
    chars = "".join("".join(f["alignment"]["chars"]) for f in a_frames if f.get("alignment"))
    assert chars.strip() == TEXT  # every character, the spaces between segments included
    for f in a_frames:
        if f.get("alignment"):
            length_ms = len(base64.b64decode(f["audio"])) / 2 / 24
            starts = f["alignment"]["charStartTimesMs"]
            assert starts == sorted(starts) and all(0 <= s <= length_ms + 1 for s in starts)
            assert f["normalizedAlignment"] == f["alignment"]


def test_errors_in_elevenlabs_form(compat_server: VoxgateServer) -> None:
    """A bad output_format is refused at the handshake (400, detail.status) and over REST; a wrong key 403; a bad frame is an error frame and the socket goes on."""
    with pytest.raises(InvalidStatus) as info:
        with _multi(compat_server, output_format="pcm_11025"):
            pass
    body = json.loads(info.value.response.body)
    assert info.value.response.status_code == 400
    assert body["detail"]["status"] == "unsupported_format"
    assert "pcm_16000" in body["detail"]["message"] or "pcm_8000" in body["detail"]["message"]
    with _multi(compat_server) as ws:
        ws.send("not json")
        error = json.loads(ws.recv())
        assert error["error"] == "bad_message" and "JSON" in error["message"]
        _send(ws, text=" Hello. ", context_id="z", flush=True)
        _send(ws, context_id="z", close_context=True)
        while not json.loads(ws.recv()).get("isFinal"):
            pass
    client = _client(compat_server.base_url.rstrip("/"))
    with pytest.raises(ApiError) as api:
        b"".join(client.text_to_speech.convert(VOICE, text="Hi.", output_format="pcm_11025"))
    assert api.value.status_code == 400
    assert api.value.body["detail"]["status"] == "unsupported_format"
    with pytest.raises(ApiError) as api:
        b"".join(_client(compat_server.base_url.rstrip("/"), key="wrong")
                 .text_to_speech.convert(VOICE, text="Hi."))
    assert api.value.status_code == 403 and "detail" in api.value.body


def test_rest_stream_and_convert(compat_server: VoxgateServer) -> None:
    """text_to_speech.stream (pcm_16000) and convert (mp3 by default) speak the sentence."""
    client = _client(compat_server.base_url.rstrip("/"))
    pcm = b"".join(client.text_to_speech.stream(VOICE, text=TEXT, model_id="eleven_flash_v2_5",
                                                output_format="pcm_16000"))
    assert_intelligible(s16(pcm), 16000, TEXT)
    mp3 = b"".join(client.text_to_speech.convert(VOICE, text=TEXT))
    audio, rate = decode(mp3)
    assert rate == 44100
    assert_intelligible(audio, rate, TEXT)


def _check_alignment(chars: list[str], starts: list[float], ends: list[float], seconds: float) -> None:
    """Every character of the text, in order, each within the audio, starts never going back."""
    assert "".join(chars) == TEXT
    assert len(starts) == len(ends) == len(chars)
    assert all(a <= b for a, b in zip(starts, starts[1:])), starts
    assert all(0 <= s <= e <= seconds + 1e-3 for s, e in zip(starts, ends)), (starts, ends, seconds)
    assert ends[-1] > seconds / 2  # spread over the speech, not bunched at its start


def test_rest_with_timestamps_whole_and_streamed(compat_server: VoxgateServer) -> None:
    """convert_with_timestamps: one JSON answer, the audio (pcm_16000) says the text and the
    alignment times each character in seconds; stream_with_timestamps: a chunk a line as it is
    made, the same in pieces (ElevenLabs' normalized alignment is the same: no normalising)."""
    client = _client(compat_server.base_url.rstrip("/"))
    whole = client.text_to_speech.convert_with_timestamps(VOICE, text=TEXT, output_format="pcm_16000")
    pcm = base64.b64decode(whole.audio_base_64)
    a = whole.alignment
    assert a is not None and whole.normalized_alignment == a
    _check_alignment(a.characters, a.character_start_times_seconds, a.character_end_times_seconds,
                     len(pcm) / 2 / 16000)
    assert_intelligible(s16(pcm), 16000, TEXT)
    chunks = list(client.text_to_speech.stream_with_timestamps(VOICE, text=TEXT, output_format="pcm_16000"))
    assert len(chunks) > 2
    pcm = b"".join(base64.b64decode(c.audio_base_64) for c in chunks)
    timed = [c.alignment for c in chunks if c.alignment is not None]
    _check_alignment([x for t in timed for x in t.characters],
                     [x for t in timed for x in t.character_start_times_seconds],
                     [x for t in timed for x in t.character_end_times_seconds], len(pcm) / 2 / 16000)
    assert_intelligible(s16(pcm), 16000, TEXT)
    with pytest.raises(ApiError) as api:  # refusals keep ElevenLabs' form
        client.text_to_speech.convert_with_timestamps(VOICE, text="Hi.", output_format="pcm_11025")
    assert api.value.status_code == 400 and api.value.body["detail"]["status"] == "unsupported_format"
    with pytest.raises(ApiError) as api:  # the answer in one piece holds its audio: a bounded text
        client.text_to_speech.convert_with_timestamps(VOICE, text="Hello there. " * 400)
    assert api.value.status_code == 400 and api.value.body["detail"]["status"] == "text_too_long"
    assert "stream/with-timestamps" in api.value.body["detail"]["message"]
