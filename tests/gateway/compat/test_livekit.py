"""LiveKit Agents' OpenAI, ElevenLabs, Cartesia and Deepgram TTS plugins, unmodified, against the
real server (no room: each plugin's ``synthesize`` and, where it streams, ``stream`` fed a word at
a time as an agent's LLM feeds it), configured as docs/compat.md says: only the base URL changes."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import numpy as np
import pytest

from benchmark.asr import INTELLIGIBILITY_SENTENCES
from tests.conftest import VoxgateServer
from tests.gateway.compat.conftest import API_KEY, assert_intelligible

pytestmark = pytest.mark.slow

TEXT = INTELLIGIBILITY_SENTENCES[0]
LONG = " ".join(INTELLIGIBILITY_SENTENCES[:4])
_TIMEOUT_S = 60.0
KINDS = ["openai", "elevenlabs", "cartesia", "deepgram"]


def _plugin(kind: str, port: int, session: aiohttp.ClientSession) -> Any:
    """Each plugin as docs/compat.md configures it (its defaults otherwise)."""
    base = f"http://127.0.0.1:{port}"
    if kind == "openai":
        from livekit.plugins import openai

        return openai.TTS(base_url=base + "/v1", api_key=API_KEY)
    if kind == "elevenlabs":
        from livekit.plugins import elevenlabs

        return elevenlabs.TTS(base_url=base + "/v1", api_key=API_KEY, http_session=session)
    if kind == "cartesia":
        from livekit.plugins import cartesia

        return cartesia.TTS(base_url=base, api_key=API_KEY, http_session=session)
    from livekit.plugins import deepgram

    return deepgram.TTS(base_url=base + "/v1/speak", api_key=API_KEY, http_session=session)


def _pcm(frames: list[Any]) -> tuple[np.ndarray, int]:
    rates = {f.sample_rate for f in frames}
    assert len(rates) == 1 and {f.num_channels for f in frames} == {1}, (rates, frames[:1])
    data = b"".join(bytes(f.data) for f in frames)
    return np.frombuffer(data, "<i2").astype(np.float32) / 32767, rates.pop()


async def _synthesize(kind: str, port: int) -> list[Any]:
    async with aiohttp.ClientSession() as session:
        tts = _plugin(kind, port, session)
        try:
            async with tts.synthesize(TEXT) as stream:
                return [event.frame async for event in stream]
        finally:
            await tts.aclose()


async def _stream(kind: str, port: int, text: str, *, stop_after_frames: int | None = None) -> list[Any]:
    """``text`` pushed a word at a time, then flush and end; with ``stop_after_frames`` the
    stream is closed after that many frames (an agent's interruption) and None ends it."""
    async with aiohttp.ClientSession() as session:
        tts = _plugin(kind, port, session)
        stream = tts.stream()
        try:
            for word in text.split():
                stream.push_text(word + " ")
            stream.flush()
            stream.end_input()
            frames = []
            async for event in stream:
                frames.append(event.frame)
                if stop_after_frames is not None and len(frames) >= stop_after_frames:
                    break
            return frames
        finally:
            await stream.aclose()
            await tts.aclose()


@pytest.fixture
def livekit_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="livekit")
    return caplog


def _complaints(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records
            if r.name.startswith("livekit") and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("kind", KINDS)
def test_synthesize_says_the_sentence(compat_server: VoxgateServer, kind: str,
                                      livekit_log: pytest.LogCaptureFixture) -> None:
    """``TTS.synthesize``: frames of mono 16-bit audio that say the sentence, and no warning or
    error logged by the plugin (OpenAI's asks for a request id, ``x-request-id``)."""
    frames = asyncio.run(asyncio.wait_for(_synthesize(kind, compat_server.port), _TIMEOUT_S))
    audio, rate = _pcm(frames)
    assert_intelligible(audio, rate, TEXT)
    assert _complaints(livekit_log) == []


@pytest.mark.parametrize("kind", ["elevenlabs", "cartesia", "deepgram"])
def test_stream_takes_words_as_an_llm_gives_them(compat_server: VoxgateServer, kind: str,
                                                 livekit_log: pytest.LogCaptureFixture) -> None:
    """``TTS.stream`` (the plugins that stream text in; OpenAI's does not): words pushed one at a
    time, a flush, the end: the audio says them, nothing logged."""
    from livekit.plugins import cartesia, deepgram, elevenlabs

    module = {"elevenlabs": elevenlabs, "cartesia": cartesia, "deepgram": deepgram}[kind]
    assert module.TTS(api_key="k", http_session=None).capabilities.streaming
    frames = asyncio.run(asyncio.wait_for(_stream(kind, compat_server.port, TEXT), _TIMEOUT_S))
    audio, rate = _pcm(frames)
    assert_intelligible(audio, rate, TEXT)
    assert _complaints(livekit_log) == []


@pytest.mark.parametrize("kind", ["elevenlabs", "cartesia", "deepgram"])
def test_an_interrupted_stream_leaves_the_next_one_whole(compat_server: VoxgateServer, kind: str) -> None:
    """An agent interrupted mid-speech closes its stream after a few frames; the next stream
    through the same plugin settings says its whole sentence."""
    heard = asyncio.run(asyncio.wait_for(_stream(kind, compat_server.port, LONG, stop_after_frames=3),
                                         _TIMEOUT_S))
    assert len(heard) == 3
    frames = asyncio.run(asyncio.wait_for(_stream(kind, compat_server.port, TEXT), _TIMEOUT_S))
    audio, rate = _pcm(frames)
    assert_intelligible(audio, rate, TEXT)
