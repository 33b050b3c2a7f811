"""`voxgate serve --model voxcpm2-tiny --load-format dummy --device cpu`: VoxCPM2 end to end over the
WebSocket, 48 kHz, a job per segment."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from gateway.client import VoxgateClient

pytestmark = pytest.mark.slow


def test_voxcpm2_streams_48khz_audio_over_the_websocket(server_factory: Any) -> None:
    """Two segments of 6 patches each (min_len 5, max_tokens 6: the random stop head cannot end
    them sooner) arrive as 2 x 6 x 7,680 samples at 48 kHz in pcm_s16le, the same in pcm_f32le;
    a bad option and a too-long segment are refused naming what is allowed."""
    server = server_factory("--model", "voxcpm2-tiny", "--load-format", "dummy", "--device", "cpu",
                            "--max-num-seqs", "4", "--max-model-len", "256")
    opts = {"max_tokens": 6, "min_len": 5, "inference_timesteps": 2, "seed": 3}

    async def main() -> None:
        async with VoxgateClient.connect(server.ws_url) as client:
            hello = client.hello
            assert hello["sample_rate"] == 48000 and hello["voices"] == ["default"] and hello["weights"] == "random"
            for fmt in ("pcm_s16le", "pcm_f32le"):
                stream = await client.start(options=opts, format=fmt)
                await stream.send_text("Hello there. ")
                await stream.send_text("How are you doing today?")
                await stream.end()
                audio = await stream.collect()
                assert stream.done["reason"] == "end" and len(audio) == 2 * 6 * 7680, fmt
                assert float(np.abs(np.asarray(audio, np.float32)).max()) > 0
            bad = await client.start(options={"cfg_value": 20})
            async for _ in bad.messages():
                pass
            assert bad.error["code"] == "invalid_option" and "cfg_value" in bad.error["message"]
            long = await client.start(options={"seed": 1})
            await long.send_text(" ".join(["word"] * 40) + ".")
            await long.end()
            async for _ in long.messages():
                pass
            assert long.error["code"] == "too_long" and "a row holds 256" in long.error["message"]

    asyncio.run(main())
