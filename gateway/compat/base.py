"""What the compatibility adapters share: a connection that speaks another protocol over its
own ``Session``, one output pipe per stream (encoding in order, on a thread for costly
codecs), voice names (docs/compat.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Callable

from aiohttp import web

from gateway import protocol as p
from gateway.compat.audio_out import AudioEncoder
from gateway.session import Session
from gateway.ws_handler import Connection, serve_websocket

if TYPE_CHECKING:
    from gateway.server import Gateway

__all__ = ["CompatConnection", "StreamOut", "VoiceNames", "CompatError", "HTTP_STATUS",
           "drive", "serve_adapter", "is_one_of", "load_json", "speech_options"]

log = logging.getLogger("voxgate.compat")

# native error code -> HTTP-like status, for protocols whose errors carry one
HTTP_STATUS = {
    "bad_message": 400, "unknown_type": 400, "unknown_stream": 400, "stream_exists": 400,
    "stream_ended": 400, "unknown_voice": 400, "invalid_option": 400,
    "unsupported_format": 400, "text_too_long": 400, "cloning_unsupported": 400,
    "voice_unavailable": 400, "frame_too_large": 413,
    "too_many_streams": 429, "capacity": 429, "slow_consumer": 429, "too_many_connections": 429,
    "idle_timeout": 408, "engine_restarted": 503, "engine_unavailable": 503,
    "server_shutdown": 503, "engine_failed": 503, "model_error": 500, "internal": 500,
}
_COSTLY = ("mp3", "opus", "aac")  # encoded on a thread: ~1-6 ms per 100 ms chunk


class CompatError(Exception):
    """A vendor frame or request that cannot be accepted: ``code`` (native-style), ``message``
    naming the field and what is accepted."""

    def __init__(self, code: str, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field


def drive(gateway: Gateway, conn: Any, msg: p.ClientMessage) -> None:
    """Hand one native message to the connection's session and carry out its actions."""
    gateway.apply(conn, conn.session.receive_message(msg))


class VoiceNames:
    """The voice a vendor name stands for: ``--compat-voice-map`` entries first, then the
    served voices and registered ones as they are; any other name is the served default voice
    (``--compat-unknown-voice default``) or refused (``refuse``)."""

    def __init__(self, gateway: Gateway) -> None:
        cfg = gateway.config
        self._gateway = gateway
        self._map = dict(entry.split("=", 1) for entry in cfg.compat_voice_map)
        self._refuse = cfg.compat_unknown_voice == "refuse"

    def resolve(self, name: Any, *, field: str) -> str | None:
        """The voice for ``start`` (``None``: the default). Raises ``CompatError``."""
        if name is None or name == "":
            return None
        if not isinstance(name, str) or not p._is_text(name) or len(name) > 256:
            raise CompatError("bad_message", f"'{field}' must be a voice name (a string)",
                              field=field)
        if name in self._map:
            return self._map[name]
        hello = self._gateway.engine.hello
        if hello is not None and name in hello.voices:
            return name
        store = self._gateway.voices
        if store is not None:
            try:
                if store.resolve(name) is not None:
                    return name
            except LookupError:
                return name  # ambiguous: the session says so
        if self._refuse:
            voices = list(hello.voices) if hello is not None else []
            raise CompatError("unknown_voice", f"unknown voice {p.show_value(name)} in '{field}'; "
                              f"voices: {voices}, or a name in --compat-voice-map", field=field)
        return None


class StreamOut:
    """One stream's outgoing native maps, handled in order. Audio goes through its encoder:
    inline for PCM, G.711 and FLAC (tens of microseconds a chunk), on the executor for MP3,
    Opus and AAC, whose chunks take milliseconds; the maps after a chunk wait for it.

    ``emit(msg, data)`` gets each map with its encoded bytes (for ``done`` with reason
    ``end``: the encoder's tail); ``cancel`` drops what waits and frees the encoder. Pending
    audio is bounded by ``max_pending_bytes``: past it ``on_overflow`` is called (the client's
    connection is too slow for its streams)."""

    def __init__(self, encoder: AudioEncoder, emit: Callable[[dict[str, Any], bytes], None], *,
                 executor: Executor | None, max_pending_bytes: int,
                 on_overflow: Callable[[], None]) -> None:
        self.encoder = encoder
        self._emit = emit
        self._executor = executor if encoder.fmt.encoding in _COSTLY else None
        self._items: deque[dict[str, Any]] = deque()
        self._pending_bytes = 0
        self._max_pending = max_pending_bytes
        self._on_overflow = on_overflow
        self._task: asyncio.Task[None] | None = None
        self.is_cancelled = False

    def put(self, msg: dict[str, Any]) -> None:
        if self.is_cancelled:
            return
        if self._executor is None:
            self._handle_now(msg)
            return
        self._items.append(msg)
        if msg.get("type") == "audio":
            self._pending_bytes += len(msg["pcm"])
            if self._pending_bytes > self._max_pending:
                self._on_overflow()
                return
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain())

    def flush_tail(self) -> bytes:
        """For raw formats: what the resampler still holds (before a flush's acknowledgement)."""
        return self.encoder.drain() if self._executor is None else b""

    def cancel(self) -> None:
        """Nothing more is emitted; the encoder is freed (once a chunk on the thread is done)."""
        if self.is_cancelled:
            return
        self.is_cancelled = True
        self._items.clear()
        self._pending_bytes = 0
        if self._task is None:
            self.encoder.close()

    def _handle_now(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        try:
            if kind == "audio":
                data = self.encoder.encode(msg["pcm"])
            elif kind == "done" and msg.get("reason") == "end":
                data = self.encoder.finish()
            else:
                data = b""
        except Exception:  # an encoder failure fails this chunk only; logged once per stream
            log.exception("encoding to %s failed", self.encoder.fmt)
            data = b""
        self._emit(msg, data)
        if kind in ("done", "error"):
            self.encoder.close()

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._items and not self.is_cancelled:
                msg = self._items.popleft()
                kind = msg.get("type")
                data = b""
                try:
                    if kind == "audio":
                        self._pending_bytes -= len(msg["pcm"])
                        data = await loop.run_in_executor(self._executor, self.encoder.encode,
                                                          msg["pcm"])
                    elif kind == "done" and msg.get("reason") == "end":
                        data = await loop.run_in_executor(self._executor, self.encoder.finish)
                except Exception:
                    log.exception("encoding to %s failed", self.encoder.fmt)
                if self.is_cancelled:
                    break
                self._emit(msg, data)
                if kind in ("done", "error"):
                    self.is_cancelled = True
        finally:
            self._task = None
            if self.is_cancelled:
                self.encoder.close()


class CompatConnection(Connection):
    """A WebSocket connection whose client speaks another protocol. The gateway pushes native
    maps; the adapter (``self.adapter``, set right after construction) answers in its own
    frames through ``send``. The outbox, its limit, back-pressure and closing are the native
    connection's."""

    adapter: Any

    def __init__(self, ws: Any, session: Session, max_outbox_bytes: int, *,
                 on_close_requested: Callable[[Connection], None],
                 on_overflow: Callable[[Connection], None]) -> None:
        super().__init__(ws, session, p.Encoding.JSON, max_outbox_bytes,
                         on_close_requested=on_close_requested, on_overflow=on_overflow)
        session.report_flushes = True

    def push(self, msg: dict[str, Any]) -> None:
        if self.is_closing:
            return
        try:
            self.adapter.on_native(msg)
        except Exception:  # a bug of ours: this message is lost, the connection goes on
            log.exception("a server message could not be translated")

    push_audio = push

    def send(self, tag: str | None, data: bytes | str) -> None:
        """Queue one frame (``tag``: the stream it belongs to, for ``drop``)."""
        if self.is_closing:
            return
        if not self.outbox and not self.is_sending and self._write_direct(data):
            return
        self._enqueue(tag, data)

    def drop(self, tag: str) -> None:
        """Barge-in: the stream's frames not yet written are never sent."""
        self._drop_audio(tag)

    def on_closed(self) -> None:
        self.adapter.on_closed()


async def serve_adapter(gateway: Gateway, request: web.Request,
                        make_adapter: Callable[[CompatConnection], Any], *,
                        refuse: Callable[[web.Response], web.StreamResponse],
                        not_websocket: Callable[[], web.StreamResponse],
                        idle_timeout_s: float | None = None) -> web.StreamResponse:
    """Run one vendor WebSocket: ``make_adapter(conn)`` builds the adapter (``on_frame``,
    ``on_native``, ``on_closed``) once the upgrade is done; the rest is the native runner's."""

    def make(ws: web.WebSocketResponse, session: Session) -> Connection:
        conn = CompatConnection(ws, session, gateway.config.max_outbox_bytes,
                                on_close_requested=gateway.on_close_requested,
                                on_overflow=gateway.on_slow_consumer)
        conn.adapter = make_adapter(conn)
        return conn

    def on_frame(conn: Connection, data: bytes | str) -> None:
        conn.adapter.on_frame(data)  # type: ignore[attr-defined]

    return await serve_websocket(gateway, request, make_connection=make, on_frame=on_frame,
                                 refuse=refuse, not_websocket=not_websocket,
                                 idle_timeout_s=idle_timeout_s)


def native_refusal(response: web.StreamResponse, in_vendor_form: Callable[[Any], bool],
                   make: Callable[[int, str, str | None, dict[str, str]], web.Response]) -> web.StreamResponse:
    """A vendor adapter's ``rewrite_error``: a native JSON refusal (``{"error": {"code",
    "message"}}``: admission, API key, Origin) or aiohttp's plain one, remade by ``make(status,
    message, code or None, headers)`` with its ``Retry-After``; a response that is not an error,
    or whose JSON body ``in_vendor_form`` accepts, is returned as it is."""
    if response.status < 400 or not isinstance(response, web.Response):
        return response
    try:
        body = json.loads(response.text or "")
        if isinstance(body, dict) and in_vendor_form(body):
            return response
        code: str | None = str(body["error"]["code"])
        message = str(body["error"]["message"])
    except (ValueError, KeyError, TypeError):
        code, message = None, (response.text or response.reason or "error")
    headers = {k: v for k, v in response.headers.items() if k == "Retry-After"}
    return make(response.status, message, code, headers)


def retry_headers(msg: dict[str, Any]) -> dict[str, str]:
    """``Retry-After`` (whole seconds, at least 1) for a native error that says it is retryable."""
    return {"Retry-After": str(max(1, round(msg.get("retry_after_s") or 1)))} if msg.get("retryable") else {}


async def read_body(request: web.Request, limit: int) -> bytes:
    """The request body, read until its end or until it is past ``limit`` bytes (then the
    ``limit + 1`` bytes read so far: the caller refuses it). One ``read(n)`` is not enough: it
    returns what has arrived, which for a large body under load is only its first part."""
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await request.content.read(limit + 1 - size)
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


def is_one_of(value: Any, choices: Any) -> bool:
    """``value in choices`` for a value a client sent: a list or a map (unhashable) is in no
    table of names rather than a TypeError."""
    try:
        return value in choices
    except TypeError:
        return False


def load_json(data: bytes | str) -> dict[str, Any]:
    """A client's JSON frame as a map; ``CompatError`` (``bad_message``) when it is not one."""
    import json

    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        raise CompatError("bad_message", "the frame is not valid JSON") from None
    if not isinstance(obj, dict):
        raise CompatError("bad_message", "the frame must be a JSON object")
    return obj


def speech_options(gateway: Gateway, *, speed: Any = None, field: str = "speed") -> dict[str, Any]:
    """The native options for a vendor's speed setting, where the model declares ``speed``
    (others are accepted and have no effect). Raises ``CompatError`` for a non-number."""
    if speed is None:
        return {}
    if isinstance(speed, str):
        try:
            speed = float(speed)
        except ValueError:
            raise CompatError("invalid_option", f"'{field}' must be a number", field=field) from None
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.25 <= speed <= 4.0:
        raise CompatError("invalid_option", f"'{field}' must be a number in [0.25, 4.0]",
                          field=field)
    hello = gateway.engine.hello
    declared = hello.options if hello is not None else {}
    if "speed" not in declared:
        return {}
    bounds = declared["speed"]
    lo, hi = bounds.get("min", 0.25), bounds.get("max", 4.0)
    return {"speed": min(max(float(speed), lo), hi)}
