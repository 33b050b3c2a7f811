"""One HTTP request, one stream: the driver the vendors' speech endpoints share (OpenAI's
``/v1/audio/speech``, Deepgram's and ElevenLabs' REST routes); docs/compat.md.
"""

from __future__ import annotations

import asyncio
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from aiohttp import web

from gateway import protocol as p
from gateway.compat.audio_out import AudioEncoder, OutputFormat
from gateway.compat.base import StreamOut, drive
from gateway.session import Session

if TYPE_CHECKING:
    from gateway.server import Gateway

__all__ = ["Speech", "speak"]

_STREAM = "speech"


@dataclass
class Speech:
    """What one request asks for and how its vendor frames the answer."""

    text: str
    voice: str | None
    fmt: OutputFormat
    content_type: str
    # the vendor's error response for a native error map (before any audio)
    error: Callable[[dict[str, Any]], web.StreamResponse]
    # the vendor's error response for a refusal at admission (a native JSON error response)
    refuse: Callable[[web.Response], web.StreamResponse]
    options: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    # what the body gets for one chunk (the native audio map, its encoded bytes, maybe empty:
    # the resampler holds them): the bytes, or e.g. an SSE event around them
    frame: Callable[[dict[str, Any], bytes], bytes] = lambda msg, data: data
    # written after the last audio, given the encoder's tail (an SSE "done" event)
    tail: Callable[[bytes], bytes] = lambda data: data
    mid_error: Callable[[dict[str, Any]], bytes] = lambda msg: b""  # an error after audio began


class _Request:
    """The gateway's view of one speech request (the duck type of a connection)."""

    def __init__(self, session: Session, ip: str) -> None:
        self.session = session
        self.ip = ip
        self.is_closing = False
        self.cut_off: asyncio.TimerHandle | None = None
        self.out: StreamOut | None = None
        self.items: deque[tuple[dict[str, Any], bytes]] = deque()
        self.wakeup = asyncio.Event()
        self.transport: asyncio.BaseTransport | None = None

    def push(self, msg: dict[str, Any]) -> None:
        if self.is_closing and msg.get("type") != "error":
            return
        kind = msg.get("type")
        if kind in ("audio", "done", "error") and self.out is not None and (
                msg.get("stream") == _STREAM):
            self.out.put(msg)
        elif kind == "error":  # connection-wide (slow consumer, shutdown)
            self.emit(msg, b"")

    push_audio = push

    def emit(self, msg: dict[str, Any], data: bytes) -> None:
        self.items.append((msg, data))
        self.wakeup.set()

    def request_close(self, code: int, reason: str) -> None:
        if not self.is_closing:
            self.is_closing = True
            self.emit({"type": "error", "code": "server_shutdown" if code == 1001 else
                       "slow_consumer", "message": reason or "closed"}, b"")

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


async def speak(gw: Gateway, request: web.Request, executor: Executor,
                speech: Speech) -> web.StreamResponse:
    """Speak ``speech`` and stream the audio as the response body."""
    ip = request.remote or ""
    refusal = gw.admit(ip)
    if refusal is not None:
        return speech.refuse(refusal)
    session = gw.new_session(ip)
    conn = _Request(session, ip)
    conn.transport = request.transport
    hello = gw.engine.hello
    rate = hello.sample_rate if hello is not None else 24000
    encoder = AudioEncoder(speech.fmt, input_rate=rate)
    conn.out = StreamOut(encoder, conn.emit, executor=executor,
                         max_pending_bytes=gw.config.max_outbox_bytes,
                         on_overflow=lambda: gw.on_slow_consumer(conn))  # type: ignore[arg-type]
    gw.add_connection(conn)  # type: ignore[arg-type]
    response: web.StreamResponse | None = None
    try:
        drive(gw, conn, p.Start(stream=_STREAM, voice=speech.voice, format=encoder.engine_format,
                                options=speech.options))
        drive(gw, conn, p.TextIn(stream=_STREAM, text=speech.text))
        drive(gw, conn, p.End(stream=_STREAM))
        while True:
            await conn.wakeup.wait()
            conn.wakeup.clear()
            while conn.items:
                msg, data = conn.items.popleft()
                kind = msg.get("type")
                if kind == "error":
                    if response is None:
                        return speech.error(msg)
                    tail = speech.mid_error(msg)
                    if tail:
                        await response.write(tail)
                    return response
                body = speech.frame(msg, data) if kind == "audio" else b""
                if body or (kind == "done" and response is None):
                    if response is None:
                        response = web.StreamResponse(headers={
                            "Content-Type": speech.content_type, "Cache-Control": "no-cache",
                            **speech.headers})
                        await response.prepare(request)
                    if body:
                        await response.write(body)
                if kind == "done":
                    assert response is not None
                    tail = speech.tail(data)
                    if tail:
                        await response.write(tail)
                    await response.write_eof()
                    return response
    finally:
        if conn.out is not None:
            conn.out.cancel()
        gw.remove_connection(conn)  # type: ignore[arg-type]
