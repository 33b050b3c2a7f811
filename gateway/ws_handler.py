"""``/v1/stream``: the native protocol's WebSocket adapter (aiohttp) around ``Session``, with a
bounded per-connection outbox, its writer task and the direct-write hot path
(docs/architecture.md, "Gateway").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from aiohttp import WSCloseCode, WSMsgType, web

from gateway import protocol as p
from gateway.session import Session

if TYPE_CHECKING:
    from gateway.server import Gateway

__all__ = ["Connection", "handle_stream", "serve_websocket", "CLOSE_GRACE_S",
           "WRITE_BUFFER_HIGH_BYTES"]

log = logging.getLogger("voxgate.gateway")

CLOSE_GRACE_S = 10.0  # a closing client that does not read its close frame is then cut off
_PING_INTERVAL_S = 20.0  # heartbeat: a ping every 20 s, no pong within 10 s closes
# The transport buffers up to this much before it pauses writing (back-pressure): frames then
# go to the outbox, whose limit (max_outbox_bytes) decides when the client is too slow.
WRITE_BUFFER_HIGH_BYTES = 256 * 1024


def _frame_writer(ws: Any) -> Any | None:
    """aiohttp's frame writer of a prepared ``WebSocketResponse`` if it has what the direct
    write uses, else ``None`` (every frame then goes through the writer task)."""
    writer = getattr(ws, "_writer", None)
    protocol = getattr(writer, "protocol", None)
    if (writer is None or not hasattr(writer, "_write_websocket_frame")
            or not hasattr(writer, "transport") or not hasattr(protocol, "writing_paused")):
        return None
    return writer


class Connection:
    """A connection's session, outbox and close state."""

    def __init__(self, ws: Any, session: Session, encoding: p.Encoding, max_outbox_bytes: int,
                 *, on_close_requested: Callable[[Connection], None] | None = None,
                 on_overflow: Callable[[Connection], None] | None = None) -> None:
        """``on_overflow``: the outbox passed ``max_outbox_bytes`` (it has been emptied); the
        gateway carries out ``Session.on_slow_consumer`` (cancel, error, close 1008). Without
        it the connection just closes with 1008."""
        self.ws = ws
        self.session = session
        self.encoding = encoding
        self.max_outbox_bytes = max_outbox_bytes
        # (stream id for audio frames else None, encoded frame)
        self.outbox: deque[tuple[str | None, bytes | str]] = deque()
        self.outbox_bytes = 0
        self.wakeup = asyncio.Event()
        self.is_closing = False
        self.close_code = 1000
        self.close_reason = ""
        self.last_activity = time.monotonic()
        self.is_sending = False  # the writer task is inside a send
        self._frame_writer = _frame_writer(ws)
        self._on_close_requested = on_close_requested
        self._on_overflow = on_overflow
        self.transport: asyncio.BaseTransport | None = None  # for abort()
        self.ip = ""  # the client's address
        self.cut_off: asyncio.TimerHandle | None = None  # abort() armed by the close

    @property
    def can_write_direct(self) -> bool:
        return self._frame_writer is not None

    def push(self, msg: dict[str, Any]) -> None:
        if self.is_closing:
            return
        kind = msg.get("type")
        if kind == "audio":
            self.push_audio(msg)
            return
        if kind == "done" and msg.get("reason") == "cancelled":
            self._drop_audio(msg.get("stream"))  # barge-in: audio not yet written is never sent
        self._enqueue(None, p.encode_server_message(msg, self.encoding))

    def push_audio(self, msg: dict[str, Any]) -> None:
        """``push`` for an ``audio`` map (the hot path)."""
        if self.is_closing:
            return
        data = p.encode_server_message(msg, self.encoding)
        if not self.outbox and not self.is_sending and self._write_direct(data):
            return
        self._enqueue(msg["stream"], data)

    def _write_direct(self, data: bytes | str) -> bool:
        """Write one frame now if the socket takes it without back-pressure; else ``False``."""
        writer = self._frame_writer
        if (writer is None or writer._closing or writer.protocol.writing_paused
                or writer.transport.is_closing()):
            return False
        try:
            if isinstance(data, str):
                writer._write_websocket_frame(data.encode(), WSMsgType.TEXT, 0)
            else:
                writer._write_websocket_frame(data, WSMsgType.BINARY, 0)
        except Exception:  # the connection broke under us: its reader sees the close
            log.debug("a direct write failed", exc_info=True)
        return True

    def _enqueue(self, stream: str | None, data: bytes | str) -> None:
        self.outbox.append((stream, data))
        self.outbox_bytes += len(data)
        if self.outbox_bytes > self.max_outbox_bytes:
            self.outbox.clear()
            self.outbox_bytes = 0
            if self._on_overflow is not None:
                self._on_overflow(self)
            self.request_close(1008, "slow consumer: the client is not reading its audio")
            return
        self.wakeup.set()

    def _drop_audio(self, stream: str | None) -> None:
        kept = deque(item for item in self.outbox if item[0] != stream or stream is None)
        self.outbox_bytes = sum(len(data) for _, data in kept)
        self.outbox = kept

    def request_close(self, code: int, reason: str) -> None:
        """Close after what is queued (idempotent: the first code and reason stay)."""
        if not self.is_closing:
            self.is_closing = True
            self.close_code, self.close_reason = code, reason
            self.wakeup.set()
            if self._on_close_requested is not None:
                self._on_close_requested(self)

    def abort(self) -> None:
        """Drop the TCP connection now (a client that does not read its close frame)."""
        if self.transport is not None:
            self.transport.abort()

    def on_closed(self) -> None:
        """The connection's handler has ended (a hook for adapters to free what they hold)."""


async def handle_stream(gateway: Gateway, request: web.Request) -> web.StreamResponse:
    """The ``/v1/stream`` handler: upgrade, then run the connection until it closes."""
    encoding = (p.Encoding.JSON if request.query.getall("encoding", []) == ["json"]
                else p.Encoding.MSGPACK)

    def make(ws: web.WebSocketResponse, session: Session) -> Connection:
        return Connection(ws, session, encoding, gateway.config.max_outbox_bytes,
                          on_close_requested=gateway.on_close_requested,
                          on_overflow=gateway.on_slow_consumer)

    def on_frame(conn: Connection, data: bytes | str) -> None:
        gateway.apply(conn, conn.session.receive_frame(data))

    return await serve_websocket(gateway, request, make_connection=make, on_frame=on_frame,
                                 greet=True)


async def serve_websocket(
    gateway: Gateway, request: web.Request, *,
    make_connection: Callable[[web.WebSocketResponse, Session], Connection],
    on_frame: Callable[[Connection, bytes | str], None],
    greet: bool = False, idle_timeout_s: float | None = None,
    refuse: Callable[[web.Response], web.StreamResponse] | None = None,
    not_websocket: Callable[[], web.StreamResponse] | None = None,
) -> web.StreamResponse:
    """Upgrade ``request`` and run one connection until it closes: the admission checks, the
    reader loop (``on_frame`` for each client frame), the writer task and the idle watch.
    The native protocol and the compatibility adapters (``gateway.compat``) share it.
    ``refuse`` rewrites a refusal (503, 429) into another protocol's error form."""
    ws = web.WebSocketResponse(max_msg_size=gateway.config.max_frame_bytes, compress=False,
                               heartbeat=_PING_INTERVAL_S, timeout=CLOSE_GRACE_S)
    if not ws.can_prepare(request).ok:
        return not_websocket() if not_websocket is not None else _not_websocket()
    ip = request.remote or ""
    refusal = gateway.admit(ip)
    if refusal is not None:  # draining, the engine is starting, or too many connections
        return refuse(refusal) if refuse is not None else refusal
    try:
        await ws.prepare(request)
    except BaseException:
        gateway.handshake_failed(ip)
        raise
    session = gateway.new_session(ip)
    transport = request.transport
    if transport is not None:
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)
    conn = make_connection(ws, session)
    conn.transport = transport
    conn.ip = ip
    gateway.add_connection(conn)
    if greet:
        conn.push(session.greeting())
    writer = asyncio.create_task(_writer(conn))
    idle = asyncio.create_task(_idle_watch(conn, idle_timeout_s or gateway.config.idle_timeout_s))
    try:
        async for msg in ws:
            if msg.type is WSMsgType.BINARY or msg.type is WSMsgType.TEXT:
                conn.last_activity = time.monotonic()
                on_frame(conn, msg.data)
                if conn.is_closing:
                    break
                await gateway.engine.wait_writable()
            elif msg.type is WSMsgType.ERROR:
                if ws.close_code == WSCloseCode.MESSAGE_TOO_BIG:
                    log.info("closed a connection: frame too large")
                break
    finally:
        idle.cancel()
        gateway.remove_connection(conn)
        conn.request_close(conn.close_code, conn.close_reason)
        try:
            await writer
        finally:
            if conn.cut_off is not None:
                conn.cut_off.cancel()
            conn.on_closed()
    return ws


def _not_websocket() -> web.Response:
    return web.json_response(
        {"error": {"code": "bad_request", "retryable": False,
                   "message": "/v1/stream is a WebSocket endpoint: send an Upgrade request"}},
        status=426, headers={"Upgrade": "websocket", "Connection": "Upgrade"})


async def _writer(conn: Connection) -> None:
    ws = conn.ws
    try:
        while True:
            while conn.outbox:
                _, data = conn.outbox.popleft()
                conn.outbox_bytes -= len(data)
                conn.is_sending = True
                try:
                    if isinstance(data, str):
                        await ws.send_str(data)
                    else:
                        await ws.send_bytes(data)
                finally:
                    conn.is_sending = False
            if conn.is_closing:
                break
            conn.wakeup.clear()
            await conn.wakeup.wait()
        await ws.close(code=conn.close_code, message=conn.close_reason.encode()[:123])
    except (ConnectionError, RuntimeError):  # closed under us (aiohttp raises either)
        pass


async def _idle_watch(conn: Connection, timeout_s: float) -> None:
    while not conn.is_closing:
        await asyncio.sleep(max(conn.last_activity + timeout_s - time.monotonic(), 0.01))
        if conn.session.num_active_streams:
            conn.last_activity = time.monotonic()
        elif time.monotonic() - conn.last_activity >= timeout_s:
            conn.push(p.error(p.ErrorCode.IDLE_TIMEOUT,
                              f"no message for {timeout_s:g} s; closing", retryable=True))
            conn.request_close(1001, "idle timeout")  # the writer sends the error first
