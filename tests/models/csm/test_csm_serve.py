"""`voxgate serve --model csm-tiny --load-format dummy --device cpu`: CSM end to end over the
WebSocket (a speaker id, a segment's frames as 80 ms of audio each, bad input refused)."""

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
