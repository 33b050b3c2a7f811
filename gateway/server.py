"""The gateway: one aiohttp server (HTTP and WebSocket on one port) over its engine processes.
``Gateway`` owns the lifecycle, routes engine output to connections and carries out the
sessions' actions (docs/architecture.md, "Gateway").
"""

from __future__ import annotations

import asyncio
import http
import itertools
import logging
import socket
import ssl
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from engine import messages as em
from engine.config import EngineConfig
from gateway import compat, http_routes
from gateway.admission_door import AdmissionDoor
from gateway.config import GatewayConfig
from gateway.engine_pool import EnginePool
from gateway.fd_limit import connections_allowed, raise_open_file_limit
from gateway.metrics import GatewayMetrics
from gateway.security import SecurityPolicy, security_middleware
from gateway.session import Action, Close, Session, ToClient, ToEngine
from gateway.voice_routes import VoiceRoutes
from gateway.voice_store import VoiceStore, default_data_dir
from gateway.ws_handler import CLOSE_GRACE_S, Connection, handle_stream

__all__ = ["Gateway", "WEB_DEMO_DIR", "bind_socket"]

log = logging.getLogger("voxgate.gateway")

WEB_DEMO_DIR = http_routes.WEB_DEMO_DIR
_STREAM_PATH = "/v1/stream"
_SHUTDOWN_MESSAGE = "the server is shutting down; reconnect and retry"


def _unavailable(code: str, message: str, *, retry_after_s: int) -> web.Response:
    return http_routes.error_response(503, code, message, retryable=True,
                                      headers={"Retry-After": str(retry_after_s)})


class _ServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server log: a malformed request (which aiohttp answers with a 4xx) is one
    line at INFO, not an ERROR with a traceback; a handler's own failure keeps its traceback."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kw: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            first = str(exc_info.message).strip().splitlines()[0] if exc_info.message else ""
            self.info("refused a malformed HTTP request (%s): %s", exc_info.code, first)
            return
        self.error(msg, *args, exc_info=exc_info, **kw)


def bind_socket(host: str, port: int, *, backlog: int = 1024) -> socket.socket:
    """A listening, non-blocking TCP socket on ``host:port`` (the first address ``host``
    resolves to; ``""`` or ``0.0.0.0`` is every IPv4 interface). Raises ``OSError``."""
    family, kind, proto, _, addr = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class Gateway:
    """Serves ``/v1/stream`` and the HTTP endpoints over its engine processes."""

    def __init__(self, config: GatewayConfig, engine_config: EngineConfig, *,
                 log_level: str = "INFO") -> None:
        self.config = config
        self.metrics = GatewayMetrics()
        self.engine = EnginePool(
            engine_config, config, log_level=log_level,
            on_message=self._on_engine_message, on_lost=self._on_engine_lost,
            metrics=self.metrics,
        )
        # Streams no engine has room for are refused here; capacity hints sized to the crowd.
        self.door = AdmissionDoor(self.engine.full_hint,
                                  refused_counter=self.metrics.admission_refused_at_gateway)
        self._keys = itertools.count(1)
        self._by_key: dict[int, Connection] = {}
        self._connections: set[Connection] = set()
        self._runner: web.AppRunner | None = None
        self._socket: socket.socket | None = None
        self._stopped = asyncio.Event()
        self.max_connections = config.max_connections  # lowered to fit the open-file limit
        self._num_handshakes = 0  # WebSocket upgrades admitted and not yet connections
        self._by_ip: dict[str, set[Connection]] = {}  # client address -> its connections
        self._handshakes_by_ip: Counter[str] = Counter()
        self.is_draining = False
        self.data_dir = Path(config.data_dir) if config.data_dir else default_data_dir()
        self.voices: VoiceStore | None = None  # opened by start()
        self._voice_routes: VoiceRoutes | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        """The aiohttp application: every route of the gateway."""
        policy = SecurityPolicy.for_bind(
            self.config.host, api_key=self.config.api_key,
            allowed_origins=self.config.allowed_origins, allowed_hosts=self.config.allowed_hosts,
            metrics_public=self.config.metrics_public)
        app = web.Application(middlewares=[security_middleware(policy)])
        app.router.add_get(_STREAM_PATH, partial(handle_stream, self))
        app.router.add_get("/health", partial(http_routes.health, self))
        app.router.add_get("/metrics", partial(http_routes.metrics, self))
        if self._voice_routes is None:
            raise RuntimeError("build_app() runs in start(), once the voice store is open")
        self._voice_routes.add_to(app.router)
        compat.add_to(app, self)  # OpenAI, ElevenLabs, Cartesia, Deepgram (docs/compat.md)
        app.middlewares.insert(0, http_routes.api_errors)  # outermost: the vendors' paths answered first
        app.router.add_get("/", http_routes.static_file)
        app.router.add_get("/{name}", http_routes.static_file)
        return app

    async def listen(self) -> None:
        """Bind the port and serve HTTP before the engine starts (``/health`` answers while the
        model loads). Raises ``OSError`` when the address cannot be bound (port in use)."""
        self._fit_connections_to_fd_limit()
        tls = self._tls_context()  # before binding: a bad certificate is no port taken
        sock = bind_socket(self.config.host, self.config.port)
        self._socket = sock
        await self._open_voices()
        self._runner = web.AppRunner(self.build_app(), handle_signals=False, access_log=None,
                                     shutdown_timeout=CLOSE_GRACE_S,
                                     logger=_ServerLog(logging.getLogger("voxgate.http"), {}))
        await self._runner.setup()
        await web.SockSite(self._runner, sock, ssl_context=tls).start()

    def _tls_context(self) -> ssl.SSLContext | None:
        """TLS for https and wss from ``ssl_certfile``/``ssl_keyfile``. Raises ``OSError`` or
        ``ssl.SSLError`` when they cannot be read."""
        if not self.config.ssl_certfile:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.config.ssl_certfile, self.config.ssl_keyfile or None)
        return ctx

    async def start_engine(self) -> None:
        """Start the engine and wait for its handshake. Raises ``EngineStartError``."""
        await self.engine.start()

    async def start(self) -> None:
        """``listen`` then ``start_engine``."""
        await self.listen()
        await self.start_engine()

    def _fit_connections_to_fd_limit(self) -> None:
        soft = raise_open_file_limit()
        allowed = connections_allowed(soft)
        if self.max_connections > allowed:
            log.warning("the open-file limit is %d: lowering --max-connections from %d to %d "
                        "(raise the hard limit, e.g. `ulimit -Hn`, to allow more)", soft,
                        self.max_connections, allowed)
            self.max_connections = allowed

    async def _open_voices(self) -> None:
        store = VoiceStore(self.data_dir, max_voices=self.config.max_voices)
        try:
            await asyncio.to_thread(store.open)
        except Exception as exc:  # the server serves without it; /v1/voices POST says so
            log.error("the voice store in %s cannot be opened (%s); registering voices is off",
                      store.folder, exc)
            store.close()
        else:
            self.voices = store
        self._voice_routes = VoiceRoutes(self.config, self.engine, self.voices)

    @property
    def port(self) -> int:
        if self._socket is None:
            raise RuntimeError("the gateway is not listening; call start() first")
        return self._socket.getsockname()[1]

    async def serve_forever(self) -> None:
        if self._runner is None:
            raise RuntimeError("call start() first")
        await self._stopped.wait()

    async def drain(self, timeout_s: float) -> None:
        """Stop taking connections and streams (``/health``: draining, 503), and wait up to
        ``timeout_s`` for the streams in flight to finish."""
        self.is_draining = True
        for conn in self._connections:
            conn.session.stop_accepting(_SHUTDOWN_MESSAGE)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._by_key and loop.time() < deadline:
            await asyncio.sleep(0.05)  # a shutdown, polled; nothing here waits on it in a test

    async def stop(self) -> None:
        """End the streams left (``server_shutdown``, retryable), close every connection with
        1001, stop listening, stop the engine. Idempotent."""
        self.is_draining = True
        if self._runner is not None:
            for conn in list(self._connections):
                self.apply(conn, conn.session.shutdown(_SHUTDOWN_MESSAGE))
                conn.request_close(1001, "server shutting down")
            await self._runner.cleanup()  # stops listening, then waits for the handlers
            self._runner = None
        if self._voice_routes is not None:
            self._voice_routes.close()
        if self.voices is not None:
            self.voices.close()
        await self.engine.stop()
        self._stopped.set()

    # --- connections (used by ws_handler) --------------------------------------------------

    def admit(self, ip: str) -> web.Response | None:
        """At a WebSocket handshake from ``ip``: ``None`` to go on (then ``new_session`` or
        ``handshake_failed``), or the refusal to answer (503, or 429 past the per-IP limit)."""
        if self.is_draining:
            return _unavailable("server_shutdown", _SHUTDOWN_MESSAGE, retry_after_s=5)
        if self.engine.hello is None:
            return _unavailable("engine_unavailable", "the engine is starting", retry_after_s=5)
        if len(self._connections) + self._num_handshakes >= self.max_connections:
            return _unavailable("too_many_connections", f"the server has {self.max_connections} "
                                "connections open (--max-connections)", retry_after_s=1)
        per_ip = self.config.max_connections_per_ip
        if per_ip and len(self._by_ip.get(ip, ())) + self._handshakes_by_ip[ip] >= per_ip:
            return http_routes.error_response(
                429, "too_many_connections", f"{per_ip} connections from {ip} are open "
                "(--max-connections-per-ip)", retryable=True, headers={"Retry-After": "1"})
        self._num_handshakes += 1
        self._handshakes_by_ip[ip] += 1
        return None

    def handshake_failed(self, ip: str) -> None:
        self._num_handshakes -= 1
        self._end_handshake(ip)

    def _end_handshake(self, ip: str) -> None:
        self._handshakes_by_ip[ip] -= 1
        if not self._handshakes_by_ip[ip]:
            del self._handshakes_by_ip[ip]

    def new_session(self, ip: str) -> Session:
        """The session of an admitted connection whose upgrade went through."""
        self._num_handshakes -= 1
        self._end_handshake(ip)
        hello = self.engine.hello
        if hello is None:  # only ever set once; admit() saw it
            raise RuntimeError("new_session() before the engine's handshake")
        session = Session(
            hello=hello, limits=self.config.limits(), allocate_key=lambda: next(self._keys),
            is_engine_ready=self.engine.is_ready, metrics=self.metrics,
            debug_timestamps=self.config.debug_timestamps,
            resolve_voice=self.voices.resolve if self.voices is not None else None,
            door=self.door,
        )
        if self.is_draining:
            session.stop_accepting(_SHUTDOWN_MESSAGE)
        return session

    def add_connection(self, conn: Connection) -> None:
        self._connections.add(conn)
        self._by_ip.setdefault(conn.ip, set()).add(conn)
        self.metrics.connections.set(len(self._connections))

    def remove_connection(self, conn: Connection) -> None:
        """The connection's handler is ending: its streams stop in the engine."""
        self._release(conn)
        self._connections.discard(conn)
        same_ip = self._by_ip.get(conn.ip)
        if same_ip is not None:
            same_ip.discard(conn)
            if not same_ip:
                del self._by_ip[conn.ip]
        self.metrics.connections.set(len(self._connections))

    def on_close_requested(self, conn: Connection) -> None:
        """A connection is closing (slow consumer, idle, shutdown, client gone): its streams
        stop in the engine now, and a client that does not read is cut off after a grace."""
        self._release(conn)
        conn.cut_off = asyncio.get_running_loop().call_later(CLOSE_GRACE_S, conn.abort)

    def on_slow_consumer(self, conn: Connection) -> None:
        """The outbox overflowed (and was emptied): the session cancels the streams, sends a
        ``slow_consumer`` error and closes with 1008; the close arms the cut-off."""
        self.apply(conn, conn.session.on_slow_consumer())

    def _release(self, conn: Connection) -> None:
        for key in conn.session.keys():
            self._by_key.pop(key, None)
        for action in conn.session.close():
            if isinstance(action, ToEngine):
                self.engine.send_nowait(action.msg)

    def apply(self, conn: Connection, actions: list[Action]) -> None:
        """Carry out a session's actions that need no waiting (engine sends are queued)."""
        for action in actions:
            if isinstance(action, ToClient):
                conn.push(action.msg)
            elif isinstance(action, ToEngine):
                msg = action.msg
                if isinstance(msg, em.Open):
                    if self._ip_has_too_many_streams(conn):
                        self.apply(conn, conn.session.on_engine(em.Error(
                            msg.key, "too_many_streams", f"{self.config.max_streams_per_ip} "
                            f"streams from {conn.ip} are active (--max-streams-per-ip)", True)))
                        continue
                    self._by_key[msg.key] = conn
                elif isinstance(msg, em.Cancel):
                    self._by_key.pop(msg.key, None)
                self.engine.send_nowait(msg)
            elif isinstance(action, Close):
                conn.request_close(action.code, action.reason)

    def _ip_has_too_many_streams(self, conn: Connection) -> bool:
        """Past ``max_streams_per_ip`` counting the stream being opened (the session holds it)."""
        limit = self.config.max_streams_per_ip
        return bool(limit) and sum(c.session.num_active_streams
                                   for c in self._by_ip.get(conn.ip, ())) > limit

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
        self.apply(conn, conn.session.on_engine(msg))

    def _on_engine_lost(self, keys: list[int]) -> None:
        """An engine died: the streams open in it (``keys``) fail; once no engine can serve
        (``is_failed``) every connection is told and closed, and the server exits."""
        if self.engine.is_failed:
            self._by_key.clear()
            for conn in list(self._connections):
                self.apply(conn, conn.session.on_engine_lost(is_final=True))
            return
        lost: dict[Connection, list[int]] = {}
        for key in keys:
            conn = self._by_key.pop(key, None)
            if conn is not None:
                lost.setdefault(conn, []).append(key)
        for conn, conn_keys in lost.items():
            self.apply(conn, conn.session.on_engine_lost(keys=conn_keys))

    # --- HTTP ------------------------------------------------------------------------------

    def health(self) -> tuple[http.HTTPStatus, dict[str, Any]]:
        status, body = self.engine.health()
        if self.is_draining:
            body["status"] = "draining"
            status = http.HTTPStatus.SERVICE_UNAVAILABLE
        return status, body

    def render_metrics(self) -> bytes:
        # Set at scrape time: summing per action would cost O(connections) per audio chunk.
        self.metrics.active_streams.set(sum(c.session.num_active_streams
                                            for c in self._connections))
        self.metrics.set_engine_statuses(self.engine.statuses())
        return self.metrics.render()
