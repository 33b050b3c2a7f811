"""A client misbehaving in one vendor protocol never affects streams of another, against the real server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from benchmark.asr import INTELLIGIBILITY_SENTENCES
from tests.conftest import VoxgateServer
from tests.gateway.compat.conftest import API_KEY, assert_intelligible, s16

pytestmark = pytest.mark.slow

TEXT = " ".join(INTELLIGIBILITY_SENTENCES[4:6])


def test_misbehaving_clients_leave_a_deepgram_stream_whole(compat_server: VoxgateServer) -> None:
    """While a Deepgram socket speaks: an oversized ElevenLabs frame (closed 1009), Cartesia garbage and a broken OpenAI body fail on their own; the Deepgram audio is whole."""
    base = f"ws://127.0.0.1:{compat_server.port}"
    auth = {"Authorization": f"Token {API_KEY}"}
    with connect(f"{base}/v1/speak?encoding=linear16&sample_rate=16000",
                 additional_headers=auth) as dg:
        assert json.loads(dg.recv())["type"] == "Metadata"
        for word in TEXT.split(" "):
            dg.send(json.dumps({"type": "Speak", "text": word + " "}))
        dg.send(json.dumps({"type": "Flush"}))
        with connect(f"{base}/v1/text-to-speech/x/multi-stream-input?output_format=pcm_16000",
                     additional_headers=auth, max_size=None) as el:
            # Just over the 1 MiB frame limit: a frame the sockets' buffers take whole, so the
            # server's close (1009) is not raced by the client still writing (2 MiB once was:
            # the client's send met a reset and never read the close code).
            el.send(json.dumps({"text": "a" * ((1 << 20) + (64 << 10)), "context_id": "big"}))
            with pytest.raises(ConnectionClosed):
                el.recv()
            assert el.close_code == 1009
        with connect(f"{base}/tts/websocket", additional_headers=auth) as ct:
            ct.send(b"\x00\xff garbage")
            error = json.loads(ct.recv())
            assert error["type"] == "error" and error["status_code"] == 400
        request = urllib.request.Request(compat_server.base_url + "v1/audio/speech",
                                         data=b'{"input": ', method="POST",
                                         headers={"Authorization": f"Bearer {API_KEY}"})
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=10)
        assert info.value.code == 400
        audio = b""
        while True:
            msg = dg.recv()
            if isinstance(msg, bytes):
                audio += msg
            elif json.loads(msg)["type"] == "Flushed":
                break
    assert_intelligible(s16(audio), 16000, TEXT)
