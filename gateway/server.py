"""The WebSocket + HTTP adapter around ``Session`` and ``EngineSupervisor``.

One ``Gateway`` per process. Each connection gets a ``Session`` (the protocol state machine)
and a bounded outbox drained by a writer task: when a client stops reading and its outbox passes
``max_outbox_bytes``, the connection is closed with 1008 so that it slows nobody else down.

Hot path: a frame for a connection whose outbox is empty, with no send in flight and a socket
that is not applying back-pressure (the transport's buffer under ``write_limit``), is written at
once from the engine reader's callback, without waking the writer task (at 25,000 chunks/s
the task switch, ``send``'s context manager and the event cost more than the write itself).
Everything else (back-pressure, a backlog, closing) goes through the outbox and the writer, in
order: a frame is written directly only when nothing is queued before it.

Engine output is routed synchronously by stream key from the engine queue's reader callback;
nothing here blocks the event loop.
"""

from __future__ import annotations

import asyncio
import http
import itertools
import json
import logging
import mimetypes
import time
from collections import deque
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.protocol import State

from engine import messages as em
from engine.config import EngineConfig
from gateway import protocol as p
from gateway.config import GatewayConfig
from gateway.engine_client import EngineSupervisor
from gateway.metrics import CONTENT_TYPE_LATEST, GatewayMetrics
from gateway.session import Action, Close, Session, ToClient, ToEngine

__all__ = ["Gateway", "WEB_DEMO_DIR"]

log = logging.getLogger("voxgate.gateway")

WEB_DEMO_DIR = Path(__file__).resolve().parent.parent / "web_demo"
_STREAM_PATH = "/v1/stream"
_CLOSE_GRACE_S = 10.0  # a closing client that does not read is then cut off


class _Connection:
    """A connection's session, outbox and timers."""

    def __init__(self, ws: ServerConnection, session: Session, encoding: p.Encoding,
                 max_outbox_bytes: int) -> None:
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
        self.is_sending = False  # the writer task is inside ws.send
        # Called when the outbox overflows (after it is emptied); the Gateway sets it to carry
        # out Session.on_slow_consumer.
        self.on_overflow = lambda: self.request_close(1008, "slow consumer")
        # The direct write needs these attributes of websockets' asyncio connection; without
        # them (another implementation) every frame goes through the writer task.
        self._can_write_direct = all(hasattr(ws, name) for name in
                                     ("protocol", "transport", "paused", "send_data"))

    def push(self, msg: dict[str, Any]) -> None:
        if self.is_closing:
            return
        stream = msg.get("stream")
        kind = msg.get("type")
        if kind == "audio":
            self.push_audio(msg)
            return
        if kind == "done" and msg.get("reason") == "cancelled":
            self._drop_audio(stream)  # barge-in: audio not yet written is never sent
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
        ws = self.ws
        if (not self._can_write_direct or ws.paused or ws.protocol.state is not State.OPEN
                or ws.transport.is_closing()):
            return False
        try:
            if isinstance(data, str):
                ws.protocol.send_text(data.encode())
            else:
                ws.protocol.send_binary(data)
            ws.send_data()
        except Exception:  # the connection broke under us: its reader sees the close
            log.debug("a direct write failed", exc_info=True)
        return True

    def _enqueue(self, stream: str | None, data: bytes | str) -> None:
        self.outbox.append((stream, data))
        self.outbox_bytes += len(data)
        if self.outbox_bytes > self.max_outbox_bytes:
            self.outbox.clear()
            self.outbox_bytes = 0
            self.on_overflow()
            return
        self.wakeup.set()

    def _drop_audio(self, stream: str | None) -> None:
        kept = deque(item for item in self.outbox if item[0] != stream or stream is None)
        self.outbox_bytes = sum(len(data) for _, data in kept)
        self.outbox = kept

    def request_close(self, code: int, reason: str) -> None:
        if not self.is_closing:
            self.is_closing = True
            self.close_code, self.close_reason = code, reason
            self.wakeup.set()


class Gateway:
    """Serves ``/v1/stream`` and the HTTP endpoints over one engine process."""

    def __init__(self, config: GatewayConfig, engine_config: EngineConfig, *,
                 log_level: str = "INFO") -> None:
        self.config = config
        self.metrics = GatewayMetrics()
        self.engine = EngineSupervisor(
            engine_config, config, log_level=log_level,
            on_message=self._on_engine_message, on_lost=self._on_engine_lost,
            metrics=self.metrics,
        )
        self._keys = itertools.count(1)
        self._by_key: dict[int, _Connection] = {}
        self._connections: set[_Connection] = set()
        self._server: Server | None = None

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the engine (wait for its handshake), then listen."""
        await self.engine.start()
        self._server = await serve(
            self._handle, self.config.host, self.config.port,
            process_request=self._process_request,
            max_size=self.config.max_frame_bytes,
            ping_interval=20, ping_timeout=20,
            write_limit=256 * 1024,
        )

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the gateway is not listening; call start() first")
        return self._server.sockets[0].getsockname()[1]

    async def serve_forever(self) -> None:
        if self._server is None:
            raise RuntimeError("call start() first")
        await self._server.serve_forever()

    async def stop(self) -> None:
        if self._server is not None:
            for conn in list(self._connections):
                conn.request_close(1001, "server shutting down")
            self._server.close()
            await self._server.wait_closed()
        await self.engine.stop()

    # --- engine routing --------------------------------------------------------------------

    def _on_engine_message(self, msg: em.Message) -> None:
        conn = self._by_key.get(getattr(msg, "key", -1))
        if conn is None:
            return
        if type(msg) is em.Audio:  # the hot path: no action list
            frame = conn.session.on_audio(msg)
            if frame is not None:
                conn.push_audio(frame)
            return
        if isinstance(msg, (em.Done, em.Error)):
            self._by_key.pop(msg.key, None)  # type: ignore[union-attr]
        self._apply(conn, conn.session.on_engine(msg))

    def _on_engine_lost(self) -> None:
        self._by_key.clear()
        for conn in list(self._connections):
            self._apply(conn, conn.session.on_engine_lost(is_final=self.engine.is_failed))

    def _apply(self, conn: _Connection, actions: list[Action]) -> None:
        """Carry out a session's actions that need no waiting (engine sends are queued)."""
        for action in actions:
            if isinstance(action, ToClient):
                conn.push(action.msg)
            elif isinstance(action, ToEngine):
                key = getattr(action.msg, "key", None)
                if isinstance(action.msg, em.Open):
                    self._by_key[action.msg.key] = conn
                elif isinstance(action.msg, em.Cancel) and key is not None:
                    self._by_key.pop(key, None)
                self.engine.send_nowait(action.msg)
            elif isinstance(action, Close):
                conn.request_close(action.code, action.reason)
        if conn.is_closing and conn.session.num_active_streams:
            self._on_closing(conn)

    def _on_closing(self, conn: _Connection) -> None:
        """A connection being closed (slow consumer, idle) stops its streams in the engine now,
        and a client that does not read its close frame is cut off after a grace period."""
        for key in conn.session.keys():
            self._by_key.pop(key, None)
        self._apply(conn, conn.session.close())
        asyncio.get_running_loop().call_later(_CLOSE_GRACE_S, conn.ws.transport.abort)

    def _on_slow_consumer(self, conn: _Connection) -> None:
        """The outbox overflowed: cancel the streams, error, close 1008 (Session), cut off later."""
        self._apply(conn, conn.session.on_slow_consumer())
        asyncio.get_running_loop().call_later(_CLOSE_GRACE_S, conn.ws.transport.abort)

    def _update_stream_gauge(self) -> None:
        """Set at scrape time: summing per action would cost O(connections) per audio chunk."""
        self.metrics.active_streams.set(sum(c.session.num_active_streams
                                            for c in self._connections))

    # --- WebSocket -------------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        query = parse_qs(urlsplit(ws.request.path).query) if ws.request else {}
        encoding = p.Encoding.JSON if query.get("encoding") == ["json"] else p.Encoding.MSGPACK
        hello = self.engine.hello
        if hello is None or len(self._connections) >= self.config.max_connections:
            reason = ("the engine is starting or restarting" if hello is None
                      else "too many connections")
            await ws.close(1013, reason)
            return
        session = Session(
            hello=hello, limits=self.config.limits(), allocate_key=lambda: next(self._keys),
            is_engine_ready=self.engine.is_ready, metrics=self.metrics,
            debug_timestamps=self.config.debug_timestamps,
        )
        conn = _Connection(ws, session, encoding, self.config.max_outbox_bytes)
        conn.on_overflow = lambda: self._on_slow_consumer(conn)
        self._connections.add(conn)
        self.metrics.connections.set(len(self._connections))
        conn.push(session.greeting())
        writer = asyncio.create_task(self._writer(conn))
        idle = asyncio.create_task(self._idle_watch(conn))
        try:
            async for frame in ws:
                conn.last_activity = time.monotonic()
                self._apply(conn, session.receive_frame(frame))
                if conn.is_closing:
                    break
                await self.engine.wait_writable()
        except ConnectionClosed as exc:
            if exc.rcvd is not None and exc.rcvd.code == 1009:
                log.info("closed a connection: frame too large")
        finally:
            idle.cancel()
            for key in session.keys():
                self._by_key.pop(key, None)
            self._apply(conn, session.close())
            conn.request_close(conn.close_code, conn.close_reason)
            await writer
            self._connections.discard(conn)
            self.metrics.connections.set(len(self._connections))

    async def _writer(self, conn: _Connection) -> None:
        ws = conn.ws
        try:
            while True:
                while conn.outbox:
                    _, data = conn.outbox.popleft()
                    conn.outbox_bytes -= len(data)
                    conn.is_sending = True
                    try:
                        await ws.send(data)
                    finally:
                        conn.is_sending = False
                if conn.is_closing:
                    break
                conn.wakeup.clear()
                await conn.wakeup.wait()
            await ws.close(conn.close_code, conn.close_reason)
        except ConnectionClosed:
            pass

    async def _idle_watch(self, conn: _Connection) -> None:
        timeout = self.config.idle_timeout_s
        while not conn.is_closing:
            await asyncio.sleep(max(conn.last_activity + timeout - time.monotonic(), 0.01))
            if conn.session.num_active_streams:
                conn.last_activity = time.monotonic()
            elif time.monotonic() - conn.last_activity >= timeout:
                conn.push(p.error(p.ErrorCode.IDLE_TIMEOUT,
                                  f"no message for {timeout:g} s; closing", retryable=True))
                conn.request_close(1001, "idle timeout")  # the writer sends the error first

    # --- HTTP ------------------------------------------------------------------------------

    def _process_request(self, ws: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if path == _STREAM_PATH:
            return None
        if path == "/health":
            return self._json(*self.engine.health())
        if path == "/metrics":
            self._update_stream_gauge()
            return self._respond(http.HTTPStatus.OK, self.metrics.render(), CONTENT_TYPE_LATEST)
        if path == "/v1/voices":
            hello = self.engine.hello
            if hello is None:
                return self._json(http.HTTPStatus.SERVICE_UNAVAILABLE,
                                  {"error": "engine_unavailable", "retryable": True})
            return self._json(http.HTTPStatus.OK, {
                "model": hello.model, "voices": hello.voices,
                "default_voice": hello.default_voice, "sample_rate": hello.sample_rate,
                "options": hello.options, "formats": list(p.FORMATS)})
        return self._static(path)

    def _static(self, path: str) -> Response:
        name = "index.html" if path in ("/", "") else path.lstrip("/")
        if "/" in name or name.startswith(".") or name.endswith(".py"):
            return self._respond(http.HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")
        file = WEB_DEMO_DIR / name
        if not file.is_file():
            return self._respond(http.HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")
        ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
        if name.endswith(".js"):
            ctype = "text/javascript"
        return self._respond(http.HTTPStatus.OK, file.read_bytes(), ctype)

    @staticmethod
    def _respond(status: http.HTTPStatus, body: bytes, ctype: str) -> Response:
        headers = Headers([("Content-Type", ctype), ("Content-Length", str(len(body))),
                           ("Cache-Control", "no-cache"), ("Connection", "close")])
        return Response(status.value, status.phrase, headers, body)

    def _json(self, status: http.HTTPStatus, obj: dict[str, Any]) -> Response:
        return self._respond(status, json.dumps(obj).encode(), "application/json")
