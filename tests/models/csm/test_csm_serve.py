"""`voxgate serve --model csm-tiny --load-format dummy --device cpu`: CSM end to end over the
WebSocket (a speaker id, a segment's frames as 80 ms of audio each, bad input refused; a voice
registered over HTTP as the stream's voice and as context)."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any

import pytest

from gateway.client import VoxgateClient

pytestmark = pytest.mark.slow


def test_csm_streams_audio_over_the_websocket(server_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sentence spoken by speaker 1 comes back as segments of max_tokens frames of 1,920 samples; hello and
    /health say the weights are random and list the speaker ids; an unknown speaker and a malformed
    context are refused naming what is served."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the engine's tiny tensors (see conftest.one_thread)
    server = server_factory("--model", "csm-tiny", "--load-format", "dummy", "--device", "cpu",
                            "--max-num-seqs", "4", "--max-model-len", "512")

    async def main() -> None:
        async with VoxgateClient.connect(server.ws_url) as client:
            hello = client.hello
            assert hello["weights"] == "random" and hello["sample_rate"] == 24000
            assert "0" in hello["voices"] and "9" in hello["voices"]
            stream = await client.start(voice="1", options={"max_tokens": 5, "seed": 3})
            for word in "Hello there , spoken by the second speaker .".split(" "):
                await stream.send_text(word + " ")
            await stream.end()
            audio = await stream.collect()
            # Random weights seldom stop: each segment (the engine core may cut a sentence into more
            # than one, for an early first audio) runs to max_tokens frames.
            assert stream.done["reason"] == "end" and len(audio) > 0 and len(audio) % (5 * 1920) == 0
            bad = await client.start(voice="12")
            async for _ in bad.messages():
                pass
            assert bad.error["code"] == "unknown_voice" and "'9'" in bad.error["message"]  # (the gateway checks the voice)
            bad = await client.start(options={"context": ",".join(["v-x:0"] * 9)})
            async for _ in bad.messages():
                pass
            assert bad.error["code"] == "invalid_option" and "at most 8" in bad.error["message"]
            bad = await client.start(options={"context": "v-x:1"})
            async for _ in bad.messages():
                pass
            assert bad.error["code"] == "unknown_voice" and "v-x" in bad.error["message"]

    asyncio.run(main())
    with urllib.request.urlopen(server.base_url.rstrip("/") + "/health", timeout=10) as r:
        assert json.loads(r.read())["weights"] == "random"


def test_a_voice_registered_over_http_speaks_and_serves_as_context(server_factory: Any, tmp_path: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """POST /v1/voices with a transcript, then a stream naming the voice's id speaks (its recording
    is the first context turn), and a later stream names it in its context option; a voice
    registered without a transcript is refused (voice_unavailable: CSM needs its words)."""
    import httpx

    from tests.gateway.audio_files import make_audio, tone

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    server = server_factory("--model", "csm-tiny", "--load-format", "dummy", "--device", "cpu",
                            "--max-num-seqs", "4", "--max-model-len", "512", "--data-dir", str(tmp_path))
    with httpx.Client(base_url=server.base_url.rstrip("/"), timeout=60) as http:
        ids = []
        for name, transcript in (("Alice", "I said this, a while ago."), ("Mute", None)):
            data = {"name": name, **({"transcript": transcript} if transcript else {})}
            r = http.post("/v1/voices", data=data,
                          files={"file": ("a.wav", make_audio("wav", tone(1.0, 16000), 16000), "audio/wav")})
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
    alice, mute = ids

    async def speak(client: Any, **kw: Any) -> Any:
        stream = await client.start(**kw)
        await stream.send_text("Cloned words here. ")
        await stream.end()
        return stream, await stream.collect()

    async def main() -> None:
        async with VoxgateClient.connect(server.ws_url) as client:
            stream, audio = await speak(client, voice=alice, options={"max_tokens": 4, "seed": 1})
            # (segments of max_tokens frames, as above)
            assert stream.done["reason"] == "end" and len(audio) > 0 and len(audio) % (4 * 1920) == 0
            stream, audio = await speak(client, voice="1", options={"max_tokens": 3, "context": f"{alice}:0"})
            assert stream.done["reason"] == "end" and len(audio) > 0 and len(audio) % (3 * 1920) == 0
            bad = await client.start(voice=mute)
            async for _ in bad.messages():
                pass
            assert bad.error["code"] == "voice_unavailable" and "transcript" in bad.error["message"]

    asyncio.run(main())
