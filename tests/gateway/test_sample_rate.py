"""start's ``sample_rate`` end to end: the real ``voxgate serve`` (synthetic engine, 24 kHz) on
port 0 resamples a stream's audio to the rate it asks for, as soxr would, and leaves the others
alone."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import soxr

from engine.synthetic import SyntheticBackend
from gateway.client import ClientStream, VoxgateClient
from tests.conftest import VoxgateServer, start_server

pytestmark = pytest.mark.slow

MODEL_RATE = 24000
RATES = [8000, 16000, 22050, 24000, 32000, 44100, 48000]
# A flush between the two halves: the resampler's tail is pushed out there and at the end.
HALF_1 = "The first half is a sentence of its own, long enough to make a segment. "
HALF_2 = "Then the second half follows the flush, and the stream ends."
TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def synth() -> Any:
    server = start_server("--model", "synthetic", "--synthetic-fast")
    yield server
    server.stop()


async def _speak(stream: ClientStream, *, end: bool = True) -> None:
    for word in HALF_1.split(" "):
        await stream.send_text(word + " ")
    await stream.flush()
    if not end:
        return
    for word in HALF_2.split(" "):
        await stream.send_text(word + " ")
    await stream.end()


async def _frames(stream: ClientStream) -> list[dict[str, Any]]:
    """The stream's audio maps, read until ``done`` (failing on an error)."""
    frames = []
    async for msg in stream.messages():
        assert msg["type"] != "error", msg
        if msg["type"] == "audio":
            frames.append(msg)
    assert stream.done is not None and stream.done["reason"] == "end"
    return frames


async def _all(stream: ClientStream) -> list[dict[str, Any]]:
    return [msg async for msg in stream.messages()]


def _pcm(stream: ClientStream, frames: list[dict[str, Any]]) -> np.ndarray:
    chunks = [stream.decode_pcm(f["pcm"]) for f in frames]
    return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


def _synthetic_audio(segments: list[str]) -> np.ndarray:
    """What the synthetic engine makes for these segments, rendered here in-process."""
    backend = SyntheticBackend(sample_rate=MODEL_RATE, realtime=False)
    out = []
    for job_id, text in enumerate(segments):
        backend.add_job(job_id, text, "tone", {})
        while backend.has_work():
            out += [o.pcm for o in backend.step() if o.pcm is not None]
    return np.concatenate(out)


def test_resampled_streams_are_soxr_of_the_native_audio(synth: VoxgateServer) -> None:
    """Streams at 16 and 48 kHz (and s16 at 8 kHz) carry soxr's resampling of the native
    stream's audio, cut at the flush: their lengths are its length times the ratio within a
    sample per segment, their samples within float rounding (s16: one step); ready, done and
    offsets say the delivered rate; the native stream is the engine's audio, byte for byte."""

    async def main() -> None:
        async with VoxgateClient.connect(synth.ws_url) as client:
            native = await client.start(format="pcm_f32le")
            native_s16 = await client.start()
            at_16k = await client.start(format="pcm_f32le", sample_rate=16000)
            at_48k = await client.start(format="pcm_f32le", sample_rate=48000)
            at_8k_s16 = await client.start(sample_rate=8000)
            streams = [native, native_s16, at_16k, at_48k, at_8k_s16]
            await asyncio.gather(*(_speak(s) for s in streams))
            frames = await asyncio.wait_for(asyncio.gather(*(_frames(s) for s in streams)),
                                            TIMEOUT_S)
            return streams, frames

    streams, frames = asyncio.run(main())
    native, native_s16, at_16k, at_48k, at_8k_s16 = streams
    f_native = frames[0]
    x = _pcm(native, f_native)
    # The native stream is the engine's audio untouched: the segments rendered in-process.
    segments = [f["text"] for f in f_native if "text" in f]
    assert b"".join(f["pcm"] for f in f_native) == _synthetic_audio(segments).tobytes()
    assert [s.ready["sample_rate"] for s in streams] == [24000, 24000, 16000, 48000, 8000]
    assert native_s16.ready["format"] == "pcm_s16le"
    # The flush cuts the native audio where the first half's segments end.
    cut = sum(len(f["pcm"]) // 4 for f in f_native if f["span"][1] <= len(HALF_1))
    assert 0 < cut < x.size

    for stream, got_frames, rate, tol in ((at_16k, frames[2], 16000, 1e-5),
                                          (at_48k, frames[3], 48000, 1e-5),
                                          (at_8k_s16, frames[4], 8000, 1.5 / 32767)):
        y = _pcm(stream, got_frames)
        ref = np.concatenate([soxr.resample(x[:cut], MODEL_RATE, rate, quality="HQ"),
                              soxr.resample(x[cut:], MODEL_RATE, rate, quality="HQ")])
        assert abs(y.size - x.size * rate / MODEL_RATE) <= 2  # one drain at the flush, one at end
        assert y.size == ref.size
        np.testing.assert_allclose(y, ref, atol=tol)
        assert stream.done["samples"] == y.size
        assert stream.done["audio_s"] == pytest.approx(y.size / rate, abs=1e-5)
        offsets = [f["offset"] for f in got_frames]
        sizes = [len(f["pcm"]) // (4 if stream.format == "pcm_f32le" else 2) for f in got_frames]
        assert offsets == list(np.cumsum([0] + sizes[:-1]))
        assert all(size > 0 for size in sizes)
        # every segment's text is on the frames, as on the native stream's
        assert "".join(f.get("text", "") for f in got_frames) == "".join(segments)


def test_hello_lists_the_output_rates(synth: VoxgateServer) -> None:
    """hello says the model's rate and the rates a stream may ask for."""

    async def main() -> dict[str, Any]:
        async with VoxgateClient.connect(synth.ws_url) as client:
            return client.hello

    hello = asyncio.run(main())
    assert hello["sample_rate"] == MODEL_RATE
    assert hello["output_sample_rates"] == RATES


@pytest.mark.parametrize("value", ["16000", 16000.0, True, 12345, 0, -16000, 2**63, [16000]])
def test_bad_sample_rate_is_refused_and_other_streams_go_on(synth: VoxgateServer,
                                                            value: Any) -> None:
    """A start whose sample_rate is not an integer of the set gets unsupported_format (not
    retryable, naming the rates) for that stream only: a stream speaking on the same connection
    finishes whole, and the id then starts with a good rate."""

    async def main() -> None:
        async with VoxgateClient.connect(synth.ws_url) as client:
            other = await client.start(format="pcm_f32le")
            speaking = asyncio.create_task(_speak(other))
            bad = await client.start(stream_id="b", sample_rate=value)
            msgs = await asyncio.wait_for(_all(bad), TIMEOUT_S)
            assert [m["type"] for m in msgs] == ["error"] and bad.ready is None
            error = bad.error
            assert error["code"] == "unsupported_format" and error["retryable"] is False
            assert error["stream"] == "b"
            assert "sample_rate" in error["message"]
            assert all(str(rate) in error["message"] for rate in RATES)
            again = await client.start(stream_id="b", sample_rate=16000)
            await asyncio.gather(speaking, _speak(again))
            got = await asyncio.wait_for(asyncio.gather(_frames(other), _frames(again)),
                                         TIMEOUT_S)
            x = _pcm(other, got[0])
            assert other.done["samples"] == x.size > 0
            assert again.ready["sample_rate"] == 16000
            assert abs(again.done["samples"] - x.size * 2 / 3) <= 2
            assert not client.errors

    asyncio.run(main())


def test_flush_delivers_the_resampler_tail(synth: VoxgateServer) -> None:
    """After a flush, a 16 kHz stream receives all of the flushed text's audio (the resampler's
    tail included) before any more text or its end."""

    async def main() -> None:
        async with VoxgateClient.connect(synth.ws_url) as client:
            native = await client.start()
            await _speak(native, end=False)
            await native.end()
            n = sum(len(f["pcm"]) // 2 for f in await asyncio.wait_for(_frames(native),
                                                                     TIMEOUT_S))
            stream = await client.start(sample_rate=16000)
            await _speak(stream, end=False)  # the first half, then a flush; no end yet
            received = 0
            expected = round(n * 2 / 3)

            async def read_flushed_audio() -> None:
                nonlocal received
                async for msg in stream.messages():
                    if msg["type"] == "audio":
                        received += len(msg["pcm"]) // 2
                        if received >= expected - 1:
                            return

            await asyncio.wait_for(read_flushed_audio(), TIMEOUT_S)
            assert stream.ready["sample_rate"] == 16000
            await stream.end()
            await asyncio.wait_for(_frames(stream), TIMEOUT_S)
            assert abs(received - n * 2 / 3) <= 1
            assert stream.done["samples"] == received  # nothing came after the flush's audio

    asyncio.run(main())


def test_cancel_drops_the_resampler_tail(synth: VoxgateServer) -> None:
    """A cancelled resampled stream gets its done at once and no audio after it (the held tail
    is dropped, not sent)."""

    async def main() -> None:
        async with VoxgateClient.connect(synth.ws_url) as client:
            stream = await client.start(sample_rate=48000)
            for word in (HALF_1 + HALF_2).split(" "):
                await stream.send_text(word + " ")
            async def cancel_after_first_chunk() -> None:
                async for msg in stream.messages():
                    if msg["type"] == "audio" and msg["seq"] == 0:
                        await stream.cancel()

            await asyncio.wait_for(cancel_after_first_chunk(), TIMEOUT_S)
            assert stream.ready["sample_rate"] == 48000
            assert stream.done["reason"] == "cancelled"
            check = await client.start(sample_rate=48000)  # the connection goes on
            await _speak(check)
            assert len(await asyncio.wait_for(check.collect(), TIMEOUT_S)) > 0
            assert stream._queue.empty()  # nothing came for the cancelled stream after its done

    asyncio.run(main())
