"""pipecat's OpenAI, Deepgram, Cartesia and ElevenLabs (WebSocket and HTTP) TTS services, unmodified, in a minimal pipeline (no audio device) against the real server."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import numpy as np
import pytest
from pipecat.frames import frames as pipecat_frames
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineParams, PipelineTask
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from benchmark.asr import INTELLIGIBILITY_SENTENCES
from tests.conftest import VoxgateServer
from tests.gateway.compat.conftest import API_KEY, assert_intelligible

pytestmark = pytest.mark.slow


SENTENCES = INTELLIGIBILITY_SENTENCES[0:2]
LONG = " ".join(INTELLIGIBILITY_SENTENCES[3:9])
_LONG_S = 14.0  # about what the embedded voice takes to say LONG (14.7 s measured)
SHORT = INTELLIGIBILITY_SENTENCES[1]


class _Collect(FrameProcessor):
    """Keeps every frame that reaches the end of the pipeline; ``heard`` is set at the first audio."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[Any] = []
        self.heard = asyncio.Event()

    async def process_frame(self, frame: Any, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.frames.append(frame)
        if isinstance(frame, pipecat_frames.TTSAudioRawFrame):
            self.heard.set()
        await self.push_frame(frame, direction)


def _service(kind: str, port: int, session: aiohttp.ClientSession) -> Any:
    """Each service as docs/compat.md configures it: only its URL points at voxgate."""
    if kind == "elevenlabs-http":  # the REST stream with timestamps
        from pipecat.services.elevenlabs.tts import ElevenLabsHttpTTSService

        return ElevenLabsHttpTTSService(api_key=API_KEY, base_url=f"http://127.0.0.1:{port}",
                                        voice_id="21m00Tcm4TlvDq8ikWAM", aiohttp_session=session)
    if kind == "openai":
        from pipecat.services.openai.tts import OpenAITTSService

        return OpenAITTSService(api_key=API_KEY, base_url=f"http://127.0.0.1:{port}/v1",
                                voice="alloy")
    if kind == "deepgram":
        from pipecat.services.deepgram.tts import DeepgramTTSService

        return DeepgramTTSService(api_key=API_KEY, base_url=f"ws://127.0.0.1:{port}",
                                  voice="aura-2-thalia-en")
    if kind == "cartesia":
        from pipecat.services.cartesia.tts import CartesiaTTSService

        return CartesiaTTSService(api_key=API_KEY, url=f"ws://127.0.0.1:{port}/tts/websocket",
                                  voice_id="694f9389-aac1-45b6-b726-9d9369183238")
    from pipecat.services.elevenlabs.tts import ElevenLabsTTSService

    return ElevenLabsTTSService(api_key=API_KEY, url=f"ws://127.0.0.1:{port}",
                                voice_id="21m00Tcm4TlvDq8ikWAM")


async def _speak(kind: str, port: int, rate: int) -> list[Any]:
    collect = _Collect()
    async with aiohttp.ClientSession() as session:
        task = PipelineTask(Pipeline([_service(kind, port, session), collect]),
                            params=PipelineParams(audio_out_sample_rate=rate))
        await task.queue_frames([*(pipecat_frames.TTSSpeakFrame(s) for s in SENTENCES),
                                 pipecat_frames.EndFrame()])
        await asyncio.wait_for(PipelineRunner(handle_sigint=False).run(task), 120)
    return collect.frames


@pytest.mark.parametrize("kind", ["openai", "deepgram", "cartesia", "elevenlabs", "elevenlabs-http"])
def test_pipecat_service_speaks_each_sentence(compat_server: VoxgateServer, kind: str) -> None:
    """Two TTSSpeakFrames through the service: audio at the pipeline's rate that says them, one TTSStoppedFrame each, no ErrorFrame."""
    rate = 24000 if kind == "openai" else 16000  # OpenAI's speech is 24 kHz only
    frames = asyncio.run(_speak(kind, compat_server.port, rate))
    f = pipecat_frames
    assert not [x for x in frames if isinstance(x, f.ErrorFrame)]
    audio = [x for x in frames if isinstance(x, f.TTSAudioRawFrame)]
    assert audio and {x.sample_rate for x in audio} == {rate} and {x.num_channels for x in audio} == {1}
    assert sum(isinstance(x, f.TTSStoppedFrame) for x in frames) == len(SENTENCES)
    pcm = np.frombuffer(b"".join(x.audio for x in audio), "<i2").astype(np.float32) / 32767
    assert_intelligible(pcm, rate, " ".join(SENTENCES))


async def _interrupt(kind: str, port: int, rate: int) -> list[Any]:
    """A long reply interrupted once its first audio arrives (pipecat's InterruptionFrame, as
    when the user starts speaking), then a short one spoken whole."""
    collect = _Collect()
    async with aiohttp.ClientSession() as session:
        task = PipelineTask(Pipeline([_service(kind, port, session), collect]),
                            params=PipelineParams(audio_out_sample_rate=rate))
        running = asyncio.create_task(PipelineRunner(handle_sigint=False).run(task))
        await task.queue_frame(pipecat_frames.TTSSpeakFrame(LONG))
        await asyncio.wait_for(collect.heard.wait(), 60)
        await task.queue_frame(pipecat_frames.InterruptionFrame())
        await task.queue_frames([pipecat_frames.TTSSpeakFrame(SHORT), pipecat_frames.EndFrame()])
        await asyncio.wait_for(running, 120)
    return collect.frames


@pytest.mark.parametrize("kind", ["deepgram", "cartesia", "elevenlabs", "elevenlabs-http", "openai"])
def test_an_interruption_stops_the_reply_and_the_next_is_whole(compat_server: VoxgateServer, kind: str) -> None:
    """Barge-in through the service: the interrupted reply's audio stops well short of its
    length, the next reply's audio says its sentence, no ErrorFrame."""
    rate = 24000 if kind == "openai" else 16000
    frames = asyncio.run(_interrupt(kind, compat_server.port, rate))
    f = pipecat_frames
    assert not [x for x in frames if isinstance(x, f.ErrorFrame)]
    audio = [x for x in frames if isinstance(x, f.TTSAudioRawFrame)]
    first = audio[0].context_id
    cut = sum(len(x.audio) for x in audio if x.context_id == first) / 2 / rate
    assert cut < 0.5 * _LONG_S, f"{cut:.2f} s of the interrupted reply's {_LONG_S} s"
    rest = [x for x in audio if x.context_id != first]
    pcm = np.frombuffer(b"".join(x.audio for x in rest), "<i2").astype(np.float32) / 32767
    assert_intelligible(pcm, rate, SHORT)
