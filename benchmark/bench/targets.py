"""The servers the benchmark drives: voxgate's native WebSocket and two HTTP streaming APIs
(``openai``, ``generate``); docs/benchmark.md, "Targets"."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from benchmark.bench.pcm import PcmDecoder, WavStreamDecoder
from benchmark.bench.trace import StreamTrace
from gateway.protocol import decode_server_frame, encode_client_message

__all__ = ["NativeTarget", "HttpTarget", "make_target", "TARGETS"]

TARGETS = ("native", "openai", "generate")
_BYTES_PER_SAMPLE = {"pcm_s16le": 2, "pcm_f32le": 4}


class _Connection:
    """One WebSocket carrying up to ``capacity`` streams, with a reader that demultiplexes."""

    def __init__(self, ws: Any, capacity: int, keep_pcm: bool) -> None:
        self.ws = ws
        self.capacity = capacity
        self.keep_pcm = keep_pcm
        self.streams: dict[str, tuple[StreamTrace, asyncio.Future[None]]] = {}
        self.is_closed = False
        self.reader = asyncio.create_task(self._read())

    @property
    def has_room(self) -> bool:
        return not self.is_closed and len(self.streams) < self.capacity

    async def _read(self) -> None:
        close_info = "connection closed"
        try:
            async for frame in self.ws:
                # Stamped on receipt and appended to the trace here, with no per-chunk queue:
                # at a thousand streams the client's own overhead would read as server latency.
                t = time.monotonic()
                try:
                    msg = decode_server_frame(frame)
                except Exception:  # a bad frame must not end the run
                    continue
                self._dispatch(msg, t)
        except Exception as exc:  # ConnectionClosedError and friends
            close_info = f"{type(exc).__name__}: {exc}"
        finally:
            self.is_closed = True
            code = getattr(self.ws, "close_code", None)
            reason = getattr(self.ws, "close_reason", "") or ""
            if code is not None:
                close_info = f"close code {code} {reason}".strip()
            t = time.monotonic()
            for trace, fut in list(self.streams.values()):
                trace.fail("connection_closed", close_info, t)
                if not fut.done():
                    fut.set_result(None)
            self.streams.clear()

    def _dispatch(self, msg: dict[str, Any], t: float) -> None:
        kind = msg.get("type")
        entry = self.streams.get(msg.get("stream"))  # type: ignore[arg-type]
        if entry is None:
            if kind == "error" and msg.get("stream") is None:
                # A connection-level error (idle timeout, slow consumer...): the close follows,
                # and every stream on this connection fails with this code.
                for trace, _ in self.streams.values():
                    trace.fail(str(msg.get("code")), str(msg.get("message")), t)
            return
        trace, fut = entry
        if kind == "audio":
            pcm = msg.get("pcm") or b""
            n = len(pcm) // trace.bytes_per_sample
            offset = msg.get("offset")
            if offset is not None and offset != trace.num_samples:
                trace.offset_mismatches += 1
            engine_t = msg.get("engine_t")
            trace.add_chunk(t, n, float(engine_t) if engine_t is not None else None)
            if self.keep_pcm and trace.pcm is not None:
                trace.pcm += pcm
        elif kind == "ready":
            trace.sample_rate = int(msg.get("sample_rate") or trace.sample_rate or 0) or None
            trace.server_timings["t_ready"] = t
        elif kind in ("done", "error"):
            if kind == "done":
                trace.done_reason = str(msg.get("reason"))
                trace.t_done = t
                trace.server_timings.update(
                    {k: v for k, v in msg.items() if k not in ("type", "stream", "reason")})
            else:
                trace.fail(str(msg.get("code")), str(msg.get("message")), t)
                retry = msg.get("retry_after_s")
                if isinstance(retry, (int, float)):
                    trace.retry_after_s = float(retry)
            del self.streams[trace.stream_id]
            if not fut.done():
                fut.set_result(None)

    async def close(self) -> None:
        self.is_closed = True
        with contextlib.suppress(Exception):
            await self.ws.close()
        with contextlib.suppress(BaseException):
            await self.reader


class NativeTarget:
    """voxgate's WebSocket protocol; streams share connections up to ``streams_per_connection``."""

    name = "native"

    def __init__(self, url: str, *, voice: str | None = None, fmt: str = "pcm_s16le",
                 options: dict[str, Any] | None = None, streams_per_connection: int = 1,
                 keep_pcm: bool = False, open_timeout_s: float = 30.0,
                 native_sample_rate: int | None = None) -> None:
        self.url = url
        self.voice = voice
        self.format = fmt
        self.sample_rate = native_sample_rate  # start's sample_rate (None: the model's)
        self.options = options or {}
        self.streams_per_connection = streams_per_connection
        self.keep_pcm = keep_pcm
        self.open_timeout_s = open_timeout_s
        self.info: dict[str, Any] = {}
        self._pool: list[_Connection] = []
        # Shared connections: one connect at a time, or concurrent streams would each open one.
        self._connect_lock = asyncio.Lock() if streams_per_connection > 1 else None

    async def open(self) -> None:
        """Connect once to read ``hello`` (fails fast on a wrong URL); keep it in the pool."""
        conn = await self._connect()
        self._pool.append(conn)
        limit = (self.info.get("limits") or {}).get("max_streams_per_connection")
        if isinstance(limit, int) and 0 < limit < self.streams_per_connection:
            # More would only be refused with too_many_streams: share up to the server's limit.
            self.info["bench_note"] = (f"streams per connection lowered from "
                                       f"{self.streams_per_connection} to the server's {limit}")
            self.streams_per_connection = conn.capacity = limit

    async def _connect(self) -> _Connection:
        from websockets.asyncio.client import connect

        ws = await connect(self.url, open_timeout=self.open_timeout_s, max_size=None,
                           ping_interval=None, compression=None)
        hello = decode_server_frame(await asyncio.wait_for(ws.recv(), self.open_timeout_s))
        if hello.get("type") != "hello":
            await ws.close()
            raise ConnectionError(f"expected hello from {self.url}, got {hello.get('type')!r}")
        if not self.info:
            self.info = {k: v for k, v in hello.items() if k != "type"}
        return _Connection(ws, self.streams_per_connection, self.keep_pcm)

    async def _acquire(self) -> _Connection:
        if self._connect_lock is None:
            return await self._acquire_unlocked()
        async with self._connect_lock:
            return await self._acquire_unlocked()

    async def _acquire_unlocked(self) -> _Connection:
        self._pool = [c for c in self._pool if not c.is_closed]
        for conn in self._pool:
            if conn.has_room:
                return conn
        conn = await self._connect()
        self._pool.append(conn)
        return conn

    async def run_stream(self, trace: StreamTrace, pieces: list[str],
                         token_rate: float | None) -> None:
        trace.bytes_per_sample = _BYTES_PER_SAMPLE[self.format]
        trace.sample_rate = self.sample_rate or self.info.get("sample_rate")
        if self.keep_pcm:
            trace.pcm = bytearray()
        try:
            conn = await self._acquire()
        except Exception as exc:
            trace.fail("connect_failed", f"{type(exc).__name__}: {exc}", time.monotonic())
            return
        sid = trace.stream_id
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        conn.streams[sid] = (trace, fut)
        send = conn.ws.send
        try:
            start: dict[str, Any] = {"type": "start", "stream": sid, "format": self.format}
            if self.sample_rate is not None:
                start["sample_rate"] = self.sample_rate
            if self.voice is not None:
                start["voice"] = self.voice
            if self.options:
                start["options"] = self.options
            await send(encode_client_message(start))
            t0 = time.monotonic()
            trace.t_first_text = t0
            for k, piece in enumerate(pieces):
                if token_rate and k:
                    delay = t0 + k / token_rate - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                if fut.done():  # the server ended the stream early (an error)
                    break
                await send(encode_client_message({"type": "text", "stream": sid, "text": piece}))
            if not fut.done():
                await send(encode_client_message({"type": "end", "stream": sid}))
            trace.t_end_input = time.monotonic()
            await fut
        except asyncio.CancelledError:
            # Timed out: barge in so the server stops spending on it, without waiting.
            conn.streams.pop(sid, None)
            if not conn.is_closed:
                with contextlib.suppress(Exception):
                    asyncio.get_running_loop().create_task(
                        send(encode_client_message({"type": "cancel", "stream": sid})))
            raise
        except Exception as exc:  # the connection broke while sending
            conn.streams.pop(sid, None)
            trace.fail("connection_closed", f"{type(exc).__name__}: {exc}", time.monotonic())

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._pool), return_exceptions=True)
        self._pool.clear()


class HttpTarget:
    """``openai`` (POST /v1/audio/speech, JSON) or ``generate`` (multipart POST /generate)."""

    def __init__(self, kind: str, url: str, *, voice: str | None = None,
                 model: str | None = None, response_format: str = "pcm",
                 sample_rate: int = 24000, extra: dict[str, Any] | None = None,
                 keep_pcm: bool = False) -> None:
        if kind not in ("openai", "generate"):
            raise ValueError(f"unknown HTTP target {kind!r}")
        self.name = kind
        self.base = url.rstrip("/")
        self.voice, self.model = voice, model
        self.response_format = response_format
        self.sample_rate = sample_rate
        self.extra = extra or {}
        self.keep_pcm = keep_pcm
        self.info: dict[str, Any] = {"url": self.base}
        self._client: Any = None

    async def open(self) -> None:
        import httpx

        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=30.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None))

    def _request(self, text: str) -> dict[str, Any]:
        if self.name == "openai":
            body: dict[str, Any] = {"input": text, "response_format": self.response_format}
            if self.model is not None:
                body["model"] = self.model
            if self.voice is not None:
                body["voice"] = self.voice
            body.update(self.extra)
            return {"url": f"{self.base}/v1/audio/speech", "json": body}
        fields = {"text": text, "streaming": "true", **{k: str(v) for k, v in self.extra.items()}}
        if self.voice is not None:
            fields["voice"] = self.voice
        # (None, value) parts make httpx send multipart/form-data without a file.
        return {"url": f"{self.base}/generate", "files": {k: (None, v) for k, v in fields.items()}}

    async def run_stream(self, trace: StreamTrace, pieces: list[str],
                         token_rate: float | None) -> None:
        is_wav = self.name == "generate" or self.response_format == "wav"
        decoder: PcmDecoder | WavStreamDecoder = (
            WavStreamDecoder() if is_wav else PcmDecoder(sample_rate=self.sample_rate))
        if self.keep_pcm:
            trace.pcm = bytearray()
        request = self._request("".join(pieces))
        trace.t_first_text = trace.t_end_input = time.monotonic()
        try:
            async with self._client.stream("POST", **request) as resp:
                if resp.status_code != 200:
                    body = (await resp.aread())[:300].decode("utf-8", "replace")
                    trace.fail(f"http_{resp.status_code}", body, time.monotonic())
                    with contextlib.suppress(ValueError):  # seconds; an HTTP date is not used
                        trace.retry_after_s = float(resp.headers.get("retry-after", ""))
                    return
                async for data in resp.aiter_bytes():
                    t = time.monotonic()
                    frames, pcm = decoder.feed(data)
                    if trace.sample_rate is None and decoder.is_ready:
                        trace.sample_rate = decoder.sample_rate
                        trace.bytes_per_sample = _BYTES_PER_SAMPLE[decoder.format]  # type: ignore[index]
                    if frames:
                        trace.add_chunk(t, frames)
                    if self.keep_pcm and trace.pcm is not None:
                        trace.pcm += pcm
            trace.done_reason = "eof"
            trace.t_done = time.monotonic()
        except ValueError as exc:  # a body that is not the audio we asked for
            trace.fail("bad_audio", str(exc), time.monotonic())
        except Exception as exc:  # httpx transport errors: the server closed or reset
            trace.fail("connection_error", f"{type(exc).__name__}: {exc}", time.monotonic())

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def make_target(kind: str, url: str, **kwargs: Any) -> NativeTarget | HttpTarget:
    if kind == "native":
        return NativeTarget(url, **{k: v for k, v in kwargs.items()
                                    if k in ("voice", "fmt", "options", "streams_per_connection",
                                             "keep_pcm", "native_sample_rate")})
    return HttpTarget(kind, url, **{k: v for k, v in kwargs.items()
                                    if k in ("voice", "model", "response_format", "sample_rate",
                                             "extra", "keep_pcm")})
