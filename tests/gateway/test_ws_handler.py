"""gateway.ws_handler.Connection: direct writes on the hot path, the outbox and the writer otherwise."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import msgpack
from aiohttp import web

from gateway import protocol as p
from gateway.ws_handler import Connection


class FakeProtocol:
    def __init__(self) -> None:
        self.writing_paused = False


class FakeTransport:
    def __init__(self) -> None:
        self.closing = False

    def is_closing(self) -> bool:
        return self.closing


class FakeWriter:
    """The attributes of aiohttp's WebSocketWriter that the direct write uses."""

    def __init__(self) -> None:
        self.protocol = FakeProtocol()
        self.transport = FakeTransport()
        self._closing = False
        self.written: list[bytes] = []

    def _write_websocket_frame(self, message: bytes, opcode: int, rsv: int) -> None:
        self.written.append(bytes(message))


class FakeWs:
    def __init__(self) -> None:
        self._writer = FakeWriter()
        self.written = self._writer.written

    @property
    def paused(self) -> bool:
        return self._writer.protocol.writing_paused

    @paused.setter
    def paused(self, value: bool) -> None:
        self._writer.protocol.writing_paused = value


def _audio(seq: int, stream: str = "s") -> dict[str, Any]:
    return p.audio(stream, seq=seq, offset=seq * 4, pcm=b"\x00" * 8)


def _conn(ws: FakeWs, max_outbox_bytes: int = 1 << 20) -> Connection:
    return Connection(ws, session=None, encoding=p.Encoding.MSGPACK,  # type: ignore[arg-type]
                      max_outbox_bytes=max_outbox_bytes)


def _seqs(frames: list[Any]) -> list[int]:
    return [msgpack.unpackb(f)["seq"] for f in frames]


def test_idle_open_connection_writes_audio_directly() -> None:
    """With nothing queued and no back-pressure, an audio frame is written at once."""
    ws = FakeWs()
    conn = _conn(ws)
    conn.push_audio(_audio(0))
    conn.push(_audio(1))
    assert _seqs(ws.written) == [0, 1]
    assert not conn.outbox and conn.outbox_bytes == 0


def test_back_pressure_queues_and_keeps_order() -> None:
    """A paused transport sends audio to the outbox; later frames queue behind it."""
    ws = FakeWs()
    conn = _conn(ws)
    conn.push_audio(_audio(0))
    ws.paused = True
    conn.push_audio(_audio(1))
    ws.paused = False
    conn.push_audio(_audio(2))  # the outbox is not empty: it must not overtake seq 1
    assert _seqs(ws.written) == [0]
    assert _seqs([data for _, data in conn.outbox]) == [1, 2]


def test_send_in_flight_or_closing_socket_queues() -> None:
    """While the writer is inside send, or the socket is closing, frames go to the outbox."""
    ws = FakeWs()
    conn = _conn(ws)
    conn.is_sending = True
    conn.push_audio(_audio(0))
    conn.is_sending = False
    conn.outbox.clear()
    ws._writer._closing = True
    conn.push_audio(_audio(1))
    assert ws.written == [] and len(conn.outbox) == 1


def test_non_audio_frames_go_through_the_writer() -> None:
    """ready/done/error maps are queued for the writer, so audio after them queues too."""
    ws = FakeWs()
    conn = _conn(ws)
    conn.push(p.ready("s", sample_rate=24000, fmt="pcm_s16le", voice="tone", options={}))
    conn.push_audio(_audio(0))
    assert ws.written == [] and len(conn.outbox) == 2


def test_slow_consumer_is_closed_when_the_outbox_overflows() -> None:
    """Audio queued under back-pressure past max_outbox_bytes empties the outbox, calls
    on_overflow (the gateway's slow-consumer handling) once, and closes with 1008."""
    ws = FakeWs()
    ws.paused = True
    overflows: list[tuple[int, bool]] = []
    conn = Connection(ws, session=None, encoding=p.Encoding.MSGPACK,  # type: ignore[arg-type]
                      max_outbox_bytes=200,
                      on_overflow=lambda c: overflows.append((len(c.outbox), c.is_closing)))
    for seq in range(20):
        conn.push_audio(_audio(seq))
    assert overflows == [(0, False)]  # called with the outbox emptied, before the close
    assert conn.is_closing and conn.close_code == 1008 and not conn.outbox


def test_cancel_drops_queued_audio_of_that_stream_only() -> None:
    """A cancelled 'done' drops the stream's queued audio, not another stream's."""
    ws = FakeWs()
    ws.paused = True
    conn = _conn(ws)
    conn.push_audio(_audio(0, "a"))
    conn.push_audio(_audio(0, "b"))
    conn.push(p.done("a", reason="cancelled", samples=0))
    kinds = [(stream, msgpack.unpackb(data)["type"]) for stream, data in conn.outbox]
    assert kinds == [("b", "audio"), (None, "done")]


def test_real_aiohttp_websocket_takes_the_direct_path() -> None:
    """On aiohttp's own WebSocketResponse the direct write is available and its frames arrive
    in order with those the writer task sends (an aiohttp upgrade that drops it fails here)."""

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(compress=False)
        await ws.prepare(request)
        conn = Connection(ws, session=None, encoding=p.Encoding.MSGPACK,  # type: ignore[arg-type]
                          max_outbox_bytes=1 << 20)
        assert conn.can_write_direct
        conn.push_audio(_audio(0))
        assert not conn.outbox  # written directly
        await ws.send_bytes(msgpack.packb(_audio(1)))
        conn.push_audio(_audio(2))
        await ws.close()
        return ws

    async def main() -> list[int]:
        app = web.Application()
        app.router.add_get("/ws", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as http, http.ws_connect(
                    f"http://127.0.0.1:{port}/ws") as ws:
                return [msgpack.unpackb(msg.data)["seq"] async for msg in ws]
        finally:
            await runner.cleanup()

    assert asyncio.run(main()) == [0, 1, 2]
