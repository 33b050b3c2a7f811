"""The benchmark's targets against in-process fake servers: native WebSocket, OpenAI-style
speech and multipart /generate; server errors and closes become per-stream errors."""

from __future__ import annotations

import asyncio

import pytest

from benchmark.bench.load import LevelPlan, run_level, text_pieces
from benchmark.bench.targets import HttpTarget, NativeTarget
from benchmark.bench.trace import StreamTrace



def _trace(text: str, sid: str = "s-0") -> StreamTrace:
    return StreamTrace(stream_id=sid, prompt_index=0, text=text)


async def _one(target: NativeTarget | HttpTarget, text: str, token_rate: float | None = None,
               ) -> StreamTrace:
    await target.open()
    try:
        trace = _trace(text)
        await target.run_stream(trace, text_pieces(text, streamed=token_rate is not None),
                                token_rate)
        return trace
    finally:
        await target.close()


def test_native_target_records_chunks_and_done(fakes) -> None:
    """Word-by-word text over the native protocol: one chunk per word, in order, then done."""
    async def go() -> StreamTrace:
        async with fakes.native_server() as url:
            return await _one(NativeTarget(url, keep_pcm=True), "one two three", 1000.0)

    tr = asyncio.run(go())
    assert tr.is_ok and tr.error_code is None
    assert tr.sample_rate == fakes.SAMPLE_RATE
    assert tr.chunk_samples == [fakes.CHUNK_SAMPLES] * 3
    assert tr.offset_mismatches == 0
    assert tr.pcm is not None and len(tr.pcm) == 3 * fakes.CHUNK_SAMPLES * 2
    assert tr.t_first_text <= tr.t_end_input <= tr.chunk_t[0] <= tr.t_done  # type: ignore[operator]


def test_native_target_error_and_close_fail_only_their_streams(fakes) -> None:
    """A stream error and a connection close mid-run are recorded per stream by code; other
    streams on their own connections finish normally."""
    async def go() -> list[StreamTrace]:
        async with fakes.native_server() as url:
            target = NativeTarget(url)
            await target.open()
            plan_prompts = ("fine words here", "boom [[fail]] now", "bye [[close]] now")
            plan = LevelPlan(mode="concurrency", level=3, seed=0, prompts=plan_prompts,
                             num_requests=9, timeout_s=5.0)
            traces, _ = await run_level(target, plan)
            await target.close()
            return traces

    traces = asyncio.run(go())
    by_prompt = {}
    for t in traces:
        by_prompt.setdefault(t.prompt_index, set()).add(t.error_code)
    assert by_prompt == {0: {None}, 1: {"model_error"}, 2: {"connection_closed"}}


def test_native_target_shares_connections(fakes) -> None:
    """With streams_per_connection=4, eight concurrent streams use two connections."""
    async def go() -> tuple[list[StreamTrace], int]:
        async with fakes.native_server() as url:
            target = NativeTarget(url, streams_per_connection=4)
            await target.open()
            plan = LevelPlan(mode="concurrency", level=8, seed=0, prompts=("a b c d e f",),
                             num_requests=8, token_rate=200.0)
            traces, _ = await run_level(target, plan)
            n = len(target._pool)
            await target.close()
            return traces, n

    traces, num_connections = asyncio.run(go())
    assert all(t.is_ok for t in traces)
    assert num_connections == 2


def test_native_target_unreachable_raises_on_open() -> None:
    """open() on a port nobody listens on raises (the runner turns it into exit status 1)."""
    with pytest.raises(OSError):
        asyncio.run(NativeTarget("ws://127.0.0.1:9/v1/stream").open())


@pytest.mark.parametrize("fmt", ["pcm", "wav"])
def test_openai_target_streams_pcm_or_wav(fakes, fmt: str) -> None:
    """POST /v1/audio/speech: the JSON body carries input/voice/model; audio is counted."""
    async def go() -> tuple[StreamTrace, list]:
        async with fakes.http_server() as (url, requests):
            target = HttpTarget("openai", url, voice="v1", model="m", response_format=fmt,
                                extra={"stream": True})
            return await _one(target, "alpha beta gamma delta"), requests

    tr, requests = asyncio.run(go())
    assert tr.is_ok and tr.done_reason == "eof"
    assert sum(tr.chunk_samples) == 4 * fakes.CHUNK_SAMPLES
    assert tr.sample_rate == fakes.SAMPLE_RATE
    assert requests == [{"path": "/v1/audio/speech", "input": "alpha beta gamma delta",
                         "response_format": fmt, "model": "m", "voice": "v1", "stream": True}]


def test_generate_target_multipart_chunked_wav(fakes) -> None:
    """POST /generate with multipart text and streaming=true, answered by a chunked WAV."""
    async def go() -> tuple[StreamTrace, list]:
        async with fakes.http_server() as (url, requests):
            return await _one(HttpTarget("generate", url), "one two"), requests

    tr, requests = asyncio.run(go())
    assert tr.is_ok and sum(tr.chunk_samples) == 2 * fakes.CHUNK_SAMPLES
    assert requests == [{"path": "/generate", "text": "one two", "streaming": True}]


def test_http_error_status_is_a_stream_error(fakes) -> None:
    """A non-200 answer fails the stream with http_<status> and the body as message."""
    async def go() -> StreamTrace:
        async with fakes.http_server(status=503) as (url, _):
            return await _one(HttpTarget("openai", url), "x y")

    tr = asyncio.run(go())
    assert tr.error_code == "http_503" and tr.error_message == "overloaded"
