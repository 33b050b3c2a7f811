"""`voxgate serve --model voxcpm2-tiny --load-format dummy --device cpu`: VoxCPM2 end to end over the
WebSocket, 48 kHz, a job per segment; voices registered over HTTP and cloned."""

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


def test_voices_registered_over_http_are_cloned(server_factory: Any, tmp_path) -> None:
    """POST /v1/voices (24 kHz audio, with and without a transcript), then start names each id:
    the stream speaks 6 patches of 48 kHz audio a segment that differ from the zero-shot voice's at the
    same seed; /v1/voices says the model clones."""
    import httpx

    from tests.gateway.audio_files import make_audio, tone

    server = server_factory("--model", "voxcpm2-tiny", "--load-format", "dummy", "--device", "cpu",
                            "--max-num-seqs", "4", "--max-model-len", "512", "--data-dir", str(tmp_path))
    ids = []
    with httpx.Client(base_url=server.base_url.rstrip("/"), timeout=60) as http:
        for name, transcript in (("Alice", None), ("Bob", "Some words to go on from.")):
            data = {"name": name} if transcript is None else {"name": name, "transcript": transcript}
            r = http.post("/v1/voices", data=data,
                          files={"file": ("a.wav", make_audio("wav", tone(2.0, 24000), 24000), "audio/wav")})
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        assert http.get("/v1/voices").json()["supports_cloning"] is True
    opts = {"max_tokens": 6, "min_len": 5, "inference_timesteps": 2, "seed": 3}

    async def speak(client: VoxgateClient, voice: str | None) -> np.ndarray:
        stream = await client.start(voice=voice, options=opts, format="pcm_f32le")
        await stream.send_text("Cloned words here.")
        await stream.end()
        audio = np.asarray(await stream.collect(), np.float32)
        # each segment (the segmenter may cut the sentence's first words into one of their own)
        assert stream.done["reason"] == "end" and audio.size and audio.size % (6 * 7680) == 0, (voice, stream.error)
        return audio

    async def main() -> None:
        async with VoxgateClient.connect(server.ws_url) as client:
            plain = await speak(client, None)
            for voice in ids:
                cloned = await speak(client, voice)
                assert cloned.size == plain.size and not np.allclose(cloned, plain), voice

    asyncio.run(main())
