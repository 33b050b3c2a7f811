"""OpenAI's ``POST /v1/audio/speech`` with the official ``openai`` client, against the real server."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import openai
import pytest

from benchmark.asr import INTELLIGIBILITY_SENTENCES
from tests.conftest import VoxgateServer
from tests.gateway.compat.conftest import API_KEY, assert_intelligible, decode, s16

pytestmark = pytest.mark.slow

TEXT = " ".join(INTELLIGIBILITY_SENTENCES[0:2])


def _client(server: VoxgateServer, key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "v1", api_key=key, max_retries=0)


def test_pcm_streams_as_it_is_made_and_is_intelligible(compat_server: VoxgateServer) -> None:
    """response_format pcm: raw s16le 24 kHz, body in several chunks, with OpenAI's voice names."""
    client = _client(compat_server)
    with client.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice="alloy", input=TEXT, response_format="pcm") as r:
        assert r.headers["content-type"] == "audio/pcm"
        chunks = list(r.iter_bytes(4096))
    data = b"".join(chunks)
    assert len(chunks) > 1 and len(data) % 2 == 0
    assert_intelligible(s16(data), 24000, TEXT)


@pytest.mark.parametrize("fmt,ctype", [("mp3", "audio/mpeg"), ("opus", "audio/ogg"),
                                       ("aac", "audio/aac"), ("flac", "audio/flac"),
                                       ("wav", "audio/wav")])
def test_each_format_decodes_to_the_speech(compat_server: VoxgateServer, fmt: str,
                                           ctype: str) -> None:
    """mp3 (the default), opus, aac, flac and wav come with their Content-Type and decode (FFmpeg) to the sentence."""
    client = _client(compat_server)
    kwargs = {} if fmt == "mp3" else {"response_format": fmt}
    response = client.audio.speech.create(model="tts-1", voice={"id": "nova"}, input=TEXT,
                                          **kwargs)
    assert response.response.headers["content-type"] == ctype
    audio, rate = decode(response.content)
    assert rate == (48000 if fmt == "opus" else 24000)
    assert_intelligible(audio, rate, TEXT)


def test_sse_events_carry_the_audio_then_done(compat_server: VoxgateServer) -> None:
    """stream_format sse: speech.audio.delta events (base64 audio) then one speech.audio.done with usage."""
    client = _client(compat_server)
    with client.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice="alloy", input=TEXT, response_format="pcm",
            stream_format="sse") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines()
                  if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "speech.audio.done" and set(kinds[:-1]) == {"speech.audio.delta"}
    assert len(kinds) > 2 and "usage" in events[-1]
    data = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert_intelligible(s16(data), 24000, TEXT)


def test_bad_requests_get_openai_errors_naming_the_field(compat_server: VoxgateServer) -> None:
    """Unknown formats, fields and out-of-range values are 400 invalid_request_error with param; nothing is spoken."""
    client = _client(compat_server)
    cases = [({"response_format": "ogg"}, "response_format"), ({"speed": 9.0}, "speed"),
             ({"input": ""}, "input"), ({"extra_body": {"colour": "blue"}}, "colour"),
             ({"stream_format": "chunks"}, "stream_format")]
    for override, param in cases:
        kwargs = {"model": "tts-1", "voice": "alloy", "input": "Hello.", **override}
        with pytest.raises(openai.BadRequestError) as info:
            client.audio.speech.create(**kwargs)
        error = info.value.body
        assert info.value.status_code == 400 and error["type"] == "invalid_request_error"
        assert error["param"] == param, error
        assert param in error["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.speech.create(model="tts-1", voice="alloy", input="x" * 60000)
    assert info.value.body["param"] == "input"


def test_each_answer_carries_a_request_id_the_client_reads(compat_server: VoxgateServer) -> None:
    """A speech and an error each carry their own ``x-request-id`` (OpenAI's header; the SDK's
    ``request_id``), streamed or not."""
    client = _client(compat_server)
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input="Hello.", response_format="pcm") as r:
        first = r.request_id
        r.read()
    second = client.audio.speech.with_raw_response.create(model="tts-1", voice="alloy", input="Hello.",
                                                          response_format="wav").request_id
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.speech.create(model="tts-1", voice="alloy", input="Hello.", speed=9.0)
    ids = [first, second, info.value.request_id]
    assert all(i and i.startswith("req_") for i in ids) and len(set(ids)) == 3, ids


def test_keys_are_checked_in_openai_form(compat_server: VoxgateServer) -> None:
    """A wrong key is 403 permission_error through the client; no key is 401 authentication_error."""
    with pytest.raises(openai.PermissionDeniedError) as info:
        _client(compat_server, key="wrong").audio.speech.create(
            model="tts-1", voice="alloy", input="Hello.")
    assert info.value.body["type"] == "permission_error"
    request = urllib.request.Request(compat_server.base_url + "v1/audio/speech", method="POST",
                                     data=b'{"model": "tts-1", "voice": "alloy", "input": "Hi"}')
    with pytest.raises(urllib.error.HTTPError) as http_info:
        urllib.request.urlopen(request, timeout=10)
    body = json.loads(http_info.value.read())
    assert http_info.value.code == 401 and body["error"]["type"] == "authentication_error"
    assert set(body["error"]) == {"message", "type", "param", "code"}
