"""Deepgram's ``/v1/speak`` (WebSocket and REST) with the official ``deepgram-sdk``, against the real server."""

from __future__ import annotations

from typing import Any

import pytest
from deepgram import DeepgramClient
from deepgram.core.api_error import ApiError
from deepgram.environment import DeepgramClientEnvironment
from deepgram.speak.v1.types import SpeakV1Text
from websockets.exceptions import InvalidStatus

from benchmark.asr import INTELLIGIBILITY_SENTENCES
from tests.conftest import VoxgateServer
from tests.gateway.compat.conftest import API_KEY, alaw, assert_intelligible, decode, mulaw, s16

pytestmark = pytest.mark.slow

TEXT = " ".join(INTELLIGIBILITY_SENTENCES[1:3])
LONG = " ".join(INTELLIGIBILITY_SENTENCES[3:9])


def _client(server: VoxgateServer, key: str = API_KEY) -> DeepgramClient:
    http, ws = f"http://127.0.0.1:{server.port}", f"ws://127.0.0.1:{server.port}"
    env = DeepgramClientEnvironment(base=http, production=ws, agent=ws, agent_rest=http)
    return DeepgramClient(api_key=key, environment=env)


def _speak_words(ws: Any, text: str) -> None:
    words = text.split(" ")
    for i in range(0, len(words), 3):
        ws.send_text(SpeakV1Text(type="Speak", text=" ".join(words[i:i + 3]) + " "))


def _events(ws: Any) -> list[Any]:
    """Every message until the server closes: bytes for audio, the SDK's models otherwise."""
    return list(ws)


@pytest.mark.parametrize("encoding,rate,decoder", [("linear16", 16000, s16), ("mulaw", 8000, mulaw),
                                                   ("alaw", 8000, alaw)])
def test_socket_speaks_flushes_and_closes(compat_server: VoxgateServer, encoding: str, rate: int,
                                          decoder: Any) -> None:
    """Metadata first; text in pieces, then Flush: the audio at the rate and encoding asked, then Flushed (ids 0, 1); Close ends with 1000."""
    client = _client(compat_server)
    with client.speak.v1.connect(model="aura-2-thalia-en", encoding=encoding,
                                 sample_rate=rate) as ws:
        _speak_words(ws, INTELLIGIBILITY_SENTENCES[0])
        ws.send_flush()
        _speak_words(ws, TEXT)
        ws.send_flush()
        ws.send_close()
        events = _events(ws)
        close_code = ws._websocket.close_code
    assert events[0].type == "Metadata" and events[0].model_name == "aura-2-thalia-en"
    kinds = ["audio" if isinstance(e, bytes) else e.type for e in events]
    flushed = [i for i, k in enumerate(kinds) if k == "Flushed"]
    assert [events[i].sequence_id for i in flushed] == [0, 1]
    assert kinds[-1] == "Flushed" and "audio" in kinds[1:flushed[0]]
    assert "audio" in kinds[flushed[0]:flushed[1]]
    second = b"".join(e for e in events[flushed[0]:] if isinstance(e, bytes))
    assert_intelligible(decoder(second), rate, TEXT)
    assert close_code == 1000


def test_clear_drops_the_rest_and_the_socket_goes_on(compat_server: VoxgateServer) -> None:
    """Clear mid-audio: Cleared, then no audio of the cleared text; the next Speak and Flush are spoken whole."""
    client = _client(compat_server)
    with client.speak.v1.connect(model="aura-2-thalia-en", encoding="linear16",
                                 sample_rate=24000) as ws:
        assert ws.recv().type == "Metadata"
        _speak_words(ws, LONG)
        ws.send_flush()
        first = ws.recv()
        assert isinstance(first, bytes)
        ws.send_clear()
        while True:  # audio already on the wire before the Clear may still arrive
            msg = ws.recv()
            if not isinstance(msg, bytes):
                break
        assert msg.type == "Cleared"
        _speak_words(ws, TEXT)
        ws.send_flush()
        after: list[Any] = []
        while True:
            msg = ws.recv()
            after.append(msg)
            if not isinstance(msg, bytes):
                break
        ws.send_close()
        assert not _events(ws)
    assert after[-1].type == "Flushed" and after[-1].sequence_id == 1
    assert_intelligible(s16(b"".join(after[:-1])), 24000, TEXT)


def _refusal(client: DeepgramClient, **query: Any) -> int:
    """The HTTP status of a refused handshake. (The SDK turns it into ``ApiError`` with
    websockets before 14; with 14 and later, websockets' ``InvalidStatus`` comes through.)"""
    try:
        with client.speak.v1.connect(model="aura-2-thalia-en", **query):
            pass
    except ApiError as exc:
        return int(exc.status_code or 0)
    except InvalidStatus as exc:
        assert b'"err_code"' in exc.response.body  # Deepgram's error form
        return exc.response.status_code
    raise AssertionError("the handshake was not refused")


def test_socket_refusals_in_deepgram_form(compat_server: VoxgateServer) -> None:
    """An unknown encoding or rate is refused at the handshake (400); a wrong key 403; a bad frame is a Warning and the socket goes on."""
    client = _client(compat_server)
    for query in ({"encoding": "mp3"}, {"encoding": "linear16", "sample_rate": 44100}):
        assert _refusal(client, **query) == 400
    assert _refusal(_client(compat_server, key="wrong")) == 403
    with client.speak.v1.connect(model="aura-2-thalia-en") as ws:
        assert ws.recv().type == "Metadata"
        ws._websocket.send('{"type": "Shout", "text": "hi"}')
        warning = ws.recv()
        assert warning.type == "Warning" and "Speak" in warning.description
        ws._websocket.send("not json")
        assert ws.recv().type == "Warning"
        ws.send_flush()  # nothing said: acknowledged at once
        assert ws.recv().sequence_id == 0


def test_rest_formats_and_errors(compat_server: VoxgateServer) -> None:
    """POST /v1/speak: mp3 by default, linear16 in WAV at 16 kHz, both the sentence; bad queries get err_code/err_msg."""
    client = _client(compat_server)
    mp3 = b"".join(client.speak.v1.audio.generate(text=TEXT, model="aura-2-thalia-en"))
    audio, rate = decode(mp3)
    assert_intelligible(audio, rate, TEXT)
    wav = b"".join(client.speak.v1.audio.generate(text=TEXT, model="aura-2-thalia-en",
                                                 encoding="linear16", sample_rate=16000))
    audio, rate = decode(wav)
    assert wav[:4] == b"RIFF" and rate == 16000
    assert_intelligible(audio, rate, TEXT)
    with pytest.raises(ApiError) as info:
        b"".join(client.speak.v1.audio.generate(text=TEXT, encoding="linear16",
                                               sample_rate=11025))
    assert info.value.status_code == 400
    assert info.value.body["err_code"] == "UNSUPPORTED_AUDIO_FORMAT"
    assert "sample_rate" in info.value.body["err_msg"]
