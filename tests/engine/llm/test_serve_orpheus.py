"""`voxgate serve --model tiny --load-format dummy --device cpu`: the Orpheus path end to end over the WebSocket."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.client import VoxgateClient

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("extra", [(), ("--async-steps", "on")], ids=["sync", "async-steps"])
def test_orpheus_program_streams_audio_over_the_websocket(server_factory: Any, extra: tuple[str, ...]) -> None:
    """Two segments of 5 frames each arrive as 2 x 5 x 2048 samples; bad voice and option are
    named; the same with asynchronous steps."""
    server = server_factory("--model", "tiny", "--load-format", "dummy", "--device", "cpu", *extra)

    async def main() -> None:
        async with VoxgateClient.connect(server.ws_url) as client:
            assert client.hello["voices"][0] == "tara" and client.hello["sample_rate"] == 24000
            stream = await client.start(voice="leo", options={"max_tokens": 35, "seed": 3})
            await stream.send_text("Hello there. ")
            await stream.send_text("How are you?")
            await stream.end()
            audio = await stream.collect()
            # Random weights never emit the stop token: each segment runs to max_tokens.
            assert stream.done["reason"] == "end" and len(audio) == 2 * 5 * 2048
            bad_voice = await client.start(voice="nobody")
            async for _ in bad_voice.messages():
                pass
            assert bad_voice.error["code"] == "unknown_voice" and "tara" in bad_voice.error["message"]
            bad_opt = await client.start(options={"temperature": 5})
            async for _ in bad_opt.messages():
                pass
            assert bad_opt.error["code"] == "invalid_option"
            assert "temperature" in bad_opt.error["message"]

    asyncio.run(main())
