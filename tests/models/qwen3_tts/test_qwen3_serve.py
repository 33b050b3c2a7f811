"""`voxgate serve --model qwen3-tts-tiny --load-format dummy --device cpu`: Qwen3-TTS end to end
over the WebSocket, text word by word (native input streaming)."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any

import pytest

from gateway.client import VoxgateClient

pytestmark = pytest.mark.slow


def test_qwen3_streams_audio_word_by_word_over_the_websocket(server_factory: Any) -> None:
    """Words sent one at a time come back as 80 ms frames; hello and /health say the weights are
    random; a bad speaker and a bad language are named with what is served."""
    server = server_factory("--model", "qwen3-tts-tiny", "--load-format", "dummy", "--device", "cpu",
                            "--max-num-seqs", "8", "--max-model-len", "512")

    async def main() -> None:
        async with VoxgateClient.connect(server.ws_url) as client:
            hello = client.hello
            assert hello["weights"] == "random" and "ryan" in hello["voices"] and hello["sample_rate"] == 24000
            stream = await client.start(voice="ryan", options={"max_tokens": 10, "seed": 3, "language": "english"})
            for word in "Hello there , streamed one word at a time .".split(" "):
                await stream.send_text(word + " ")
            await stream.end()
            audio = await stream.collect()
            # Random weights seldom stop: the turn runs to max_tokens frames of 1,920 samples.
            assert stream.done["reason"] == "end" and len(audio) == 10 * 1920
            bad = await client.start(voice="nobody")
            async for _ in bad.messages():
                pass
            assert bad.error["code"] == "unknown_voice" and "ryan" in bad.error["message"]
            bad = await client.start(options={"language": "klingon"})
            async for _ in bad.messages():
                pass
            assert bad.error["code"] == "invalid_option" and "english" in bad.error["message"]

    asyncio.run(main())
    with urllib.request.urlopen(server.base_url.rstrip("/") + "/health", timeout=10) as r:
        assert json.loads(r.read())["weights"] == "random"


def test_a_voice_registered_over_http_clones_on_a_base_checkpoint(server_factory: Any, tmp_path) -> None:
    """POST /v1/voices on qwen3-tts-tiny-base, then start names the voice's id: the stream speaks
    (its x-vector from the speaker encoder); CustomVoice refuses registration with 409."""
    import httpx

    from tests.gateway.audio_files import make_audio, tone

    server = server_factory("--model", "qwen3-tts-tiny-base", "--load-format", "dummy", "--device", "cpu",
                            "--max-num-seqs", "8", "--max-model-len", "512", "--data-dir", str(tmp_path))
    with httpx.Client(base_url=server.base_url.rstrip("/"), timeout=60) as http:
        r = http.post("/v1/voices", data={"name": "Alice"},
                      files={"file": ("a.wav", make_audio("wav", tone(2.0, 16000), 16000), "audio/wav")})
        assert r.status_code == 201, r.text
        voice = r.json()["id"]

    async def main() -> None:
        async with VoxgateClient.connect(server.ws_url) as client:
            assert client.hello["weights"] == "random"
            stream = await client.start(voice=voice, options={"max_tokens": 6, "seed": 1})
            await stream.send_text("Cloned words here. ")
            await stream.end()
            audio = await stream.collect()
            assert stream.done["reason"] == "end" and len(audio) == 6 * 1920

    asyncio.run(main())
