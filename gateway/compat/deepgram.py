"""Deepgram's text to speech over a ``Session``: ``/v1/speak`` as a WebSocket (GET with an
upgrade) and as REST (POST); docs/compat.md has the protocol.
"""

from __future__ import annotations

import json
import logging
import uuid
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Mapping

from aiohttp import web

from gateway import protocol as p
from gateway.compat.audio_out import AudioEncoder, FormatError, OutputFormat
from gateway.compat.base import (HTTP_STATUS, CompatConnection, CompatError, StreamOut,
                                 VoiceNames, drive, load_json, native_refusal, read_body, retry_headers,
                                 serve_adapter, speech_options)
from gateway.compat.http_speech import Speech, speak

if TYPE_CHECKING:
    from gateway.server import Gateway

__all__ = ["add_routes", "PATH", "deepgram_error", "rewrite_error"]

log = logging.getLogger("voxgate.compat")

PATH = "/v1/speak"
_WS_RATES = {"linear16": (8000, 16000, 24000, 32000, 48000), "mulaw": (8000, 16000),
             "alaw": (8000, 16000)}
_REST_RATES = {**_WS_RATES, "flac": (8000, 16000, 22050, 24000, 32000, 48000),
               "mp3": (22050,), "opus": (48000,), "aac": (22050,)}
_RAW = {"linear16": "pcm_s16le", "mulaw": "mulaw", "alaw": "alaw"}
_IN_WAV = {"linear16": "wav", "mulaw": "wav_mulaw", "alaw": "wav_alaw"}
_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "flac": "audio/flac", "aac": "audio/aac"}
_ERR_CODES = {400: "INVALID_QUERY_PARAMETER", 401: "INVALID_AUTH", 403: "INSUFFICIENT_PERMISSIONS",
              404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "PAYLOAD_TOO_LARGE",
              429: "TOO_MANY_REQUESTS"}


def add_routes(router: web.UrlDispatcher, gateway: Gateway, executor: Executor) -> None:
    route = _Route(gateway, executor)
    router.add_get(PATH, route.socket)
    router.add_post(PATH, route.rest)


def deepgram_error(status: int, message: str, *, code: str | None = None,
                   headers: Mapping[str, str] | None = None) -> web.Response:
    """An error in Deepgram's REST form."""
    err_code = code or _ERR_CODES.get(status, "INTERNAL_SERVER_ERROR" if status >= 500 else
                                      "BAD_REQUEST")
    return web.json_response({"err_code": err_code, "err_msg": message,
                              "request_id": str(uuid.uuid4())}, status=status,
                             headers=dict(headers or {}))


def rewrite_error(response: web.StreamResponse) -> web.StreamResponse:
    """A native JSON refusal (admission, API key, Origin) or aiohttp's plain one in Deepgram's
    form (the route's own errors are in it already)."""
    return native_refusal(response, lambda body: "err_code" in body,
                          lambda status, message, code, headers: deepgram_error(
                              status, message, code=None if code is None else code.upper(), headers=headers))


def _from_native(msg: dict[str, Any]) -> web.StreamResponse:
    code = str(msg.get("code") or "internal")
    return deepgram_error(HTTP_STATUS.get(code, 500), str(msg.get("message")),
                          code=code.upper(), headers=retry_headers(msg))


def _int(query: Mapping[str, str], name: str) -> int | None:
    value = query.get(name)
    if value is None or value == "":
        return None
    try:
        number = float(value)  # the SDK sends its float fields as "16000.0"
        if not number.is_integer():
            raise ValueError(value)
        return int(number)
    except (ValueError, OverflowError):
        raise CompatError("invalid_option", f"'{name}' must be an integer, got "
                          f"{p.show_value(value)}", field=name) from None


class _Route:
    def __init__(self, gateway: Gateway, executor: Executor) -> None:
        self.gateway = gateway
        self.executor = executor
        self.voices = VoiceNames(gateway)

    def _format(self, query: Mapping[str, str], *, rest: bool) -> OutputFormat:
        rates = _REST_RATES if rest else _WS_RATES
        encoding = query.get("encoding") or ("mp3" if rest else "linear16")
        if encoding not in rates:
            raise CompatError("unsupported_format", f"'encoding' must be one of {list(rates)}, got "
                              f"{p.show_value(encoding)}", field="encoding")
        rate = _int(query, "sample_rate") or (24000 if encoding == "linear16" else
                                              rates[encoding][0])
        if rate not in rates[encoding]:
            raise CompatError("unsupported_format", f"'sample_rate' for {encoding} must be one "
                              f"of {list(rates[encoding])}, got {rate}", field="sample_rate")
        bit_rate = _int(query, "bit_rate") or 0
        if not rest:
            return OutputFormat(_RAW[encoding], rate)
        container = query.get("container") or ("wav" if encoding in _RAW else "")
        if encoding in _RAW:
            if container not in ("wav", "none"):
                raise CompatError("unsupported_format", f"'container' for {encoding} must be "
                                  f"'wav' or 'none', got {p.show_value(container)}",
                                  field="container")
            return OutputFormat(_IN_WAV[encoding] if container == "wav" else _RAW[encoding], rate)
        if container not in ("", "none", "ogg" if encoding == "opus" else "none"):
            raise CompatError("unsupported_format", f"'container' is not taken for {encoding}",
                              field="container")
        return OutputFormat(encoding, 24000 if encoding == "opus" else rate, bit_rate)

    def _voice(self, query: Mapping[str, str]) -> str | None:
        return self.voices.resolve(query.get("model") or None, field="model")

    async def rest(self, request: web.Request) -> web.StreamResponse:
        gw = self.gateway
        try:
            fmt = self._format(request.query, rest=True)
            voice = self._voice(request.query)
            options = speech_options(gw, speed=request.query.get("speed"))
        except (CompatError, FormatError) as exc:
            return deepgram_error(400, str(exc), code="UNSUPPORTED_AUDIO_FORMAT"
                                  if getattr(exc, "code", "") == "unsupported_format" else None)
        limit = gw.config.max_frame_bytes
        raw = await read_body(request, limit)
        if len(raw) > limit:
            return deepgram_error(413, f"the request body is larger than {limit} bytes")
        try:
            body = load_json(raw)
            text = body.get("text")
            if not isinstance(text, str) or not text.strip() or not p._is_text(text):
                raise CompatError("bad_message", "'text' must be a non-empty string")
        except CompatError as exc:
            return deepgram_error(400, exc.message, code="INVALID_BODY")
        if len(text) > gw.config.max_text_chars_per_stream:
            return deepgram_error(413, f"'text' is longer than "
                                  f"{gw.config.max_text_chars_per_stream} characters",
                                  code="TEXT_TOO_LONG")
        raw_type = {"pcm_s16le": "audio/l16", "mulaw": "audio/basic", "alaw": "audio/x-alaw-basic"}
        ctype = ("audio/wav" if fmt.encoding.startswith("wav") else
                 raw_type.get(fmt.encoding) or _TYPES[fmt.encoding])
        model = request.query.get("model") or "aura-2-thalia-en"
        return await speak(gw, request, self.executor, Speech(
            text=text, voice=voice, fmt=fmt, content_type=ctype, options=options,
            error=_from_native, refuse=rewrite_error,
            headers={"dg-request-id": str(uuid.uuid4()), "dg-model-name": model,
                     "dg-char-count": str(len(text))}))

    async def socket(self, request: web.Request) -> web.StreamResponse:
        gw = self.gateway
        try:
            fmt = self._format(request.query, rest=False)
            voice = self._voice(request.query)
            options = speech_options(gw, speed=request.query.get("speed"))
        except (CompatError, FormatError) as exc:
            return deepgram_error(400, str(exc))
        model = request.query.get("model") or "aura-2-thalia-en"

        def make(conn: CompatConnection) -> _Socket:
            return _Socket(gw, conn, self.executor, fmt, voice, options, model)

        return await serve_adapter(gw, request, make, refuse=rewrite_error, not_websocket=lambda:
                                   deepgram_error(426, "GET /v1/speak is a WebSocket: send an "
                                                  "Upgrade request, or POST for REST"))


class _Socket:
    """One Deepgram WebSocket: its current native stream and flush numbering."""

    def __init__(self, gateway: Gateway, conn: CompatConnection, executor: Executor,
                 fmt: OutputFormat, voice: str | None, options: dict[str, Any],
                 model: str) -> None:
        self.gateway = gateway
        self.conn = conn
        self.executor = executor
        self.fmt = fmt
        self.voice = voice
        self.options = options
        self._num_streams = 0
        self.stream: str | None = None  # the native stream speaking now
        self.out: dict[str, StreamOut] = {}
        self._flush_ids: dict[str, list[int]] = {}  # stream -> sequence ids not yet acknowledged
        self._num_flushes = 0
        self._text_since_flush = False
        self._is_closing = False
        conn.send(None, json.dumps({
            "type": "Metadata", "request_id": str(uuid.uuid4()), "model_name": model,
            "model_version": "voxgate", "model_uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, model))}))

    # --- client frames ---------------------------------------------------------------------

    def on_frame(self, data: bytes | str) -> None:
        try:
            self._on_frame(data)
        except CompatError as exc:
            self._warn(exc.code.upper(), exc.message)

    def _on_frame(self, data: bytes | str) -> None:
        msg = load_json(data)
        kind = msg.get("type")
        if self._is_closing:
            raise CompatError("bad_message", "the socket is closing (Close was sent)")
        if kind == "Speak":
            text = msg.get("text")
            if not isinstance(text, str) or not p._is_text(text):
                raise CompatError("bad_message", "'text' of Speak must be a string")
            if not text:
                return
            if self.stream is None:
                self._open()
                if self.stream is None:  # refused at once (a Warning said why)
                    return
            self._text_since_flush = True
            self._drive(p.TextIn(stream=self.stream, text=text))  # type: ignore[arg-type]
        elif kind == "Flush":
            sequence_id = self._num_flushes
            self._num_flushes += 1
            if self.stream is None:  # nothing to speak: acknowledged at once
                self._send_json({"type": "Flushed", "sequence_id": sequence_id})
                return
            self._flush_ids[self.stream].append(sequence_id)
            self._text_since_flush = False
            self._drive(p.Flush(stream=self.stream))
        elif kind == "Clear":
            stream = self.stream
            if stream is not None:
                self.conn.drop(stream)
                out = self.out.pop(stream, None)
                if out is not None:
                    out.cancel()
                self._flush_ids.pop(stream, None)
                self.stream = None
                self._drive(p.Cancel(stream=stream))
            self._send_json({"type": "Cleared", "sequence_id": self._num_flushes})
        elif kind == "Close":
            self._is_closing = True
            if self.stream is None:
                self.conn.request_close(1000, "")
            else:
                self._drive(p.End(stream=self.stream))
        else:
            raise CompatError("unknown_type", f"'type' must be Speak, Flush, Clear or Close, got "
                              f"{p.show_value(kind)}")

    def _open(self) -> None:
        self._num_streams += 1
        stream = f"dg-{self._num_streams}"
        encoder = AudioEncoder(self.fmt, input_rate=self.gateway.engine.hello.sample_rate)  # type: ignore[union-attr]
        self.out[stream] = StreamOut(
            encoder, self._emit, executor=None,
            max_pending_bytes=self.gateway.config.max_outbox_bytes,
            on_overflow=lambda: self.gateway.on_slow_consumer(self.conn))
        self._flush_ids[stream] = []
        self.stream = stream
        self._drive(p.Start(stream=stream, voice=self.voice, format=encoder.engine_format,
                            options=self.options))

    def _drive(self, msg: p.ClientMessage) -> None:
        drive(self.gateway, self.conn, msg)

    # --- what the session sends ------------------------------------------------------------

    def on_native(self, msg: dict[str, Any]) -> None:
        stream = msg.get("stream")
        out = self.out.get(stream) if stream is not None else None
        if out is not None:
            out.put(msg)
        elif msg.get("type") == "error" and stream is None:  # connection-wide
            self._warn(str(msg.get("code")).upper(), str(msg.get("message")))

    def _emit(self, msg: dict[str, Any], data: bytes) -> None:
        stream = msg["stream"]
        kind = msg.get("type")
        if kind == "flushed":
            out = self.out.get(stream)
            tail = out.flush_tail() if out is not None else b""
            if tail:
                self.conn.send(stream, tail)
            ids = self._flush_ids.get(stream) or [None]
            self._send_json({"type": "Flushed", "sequence_id": ids.pop(0)})
            if stream == self.stream and not ids and not self._text_since_flush \
                    and not self._is_closing:
                self.stream = None  # all spoken: end it quietly, the next Speak opens another
                self._drive(p.End(stream=stream))
            return
        if data:
            self.conn.send(stream, data)
        if kind in ("done", "error"):
            self.out.pop(stream, None)
            self._flush_ids.pop(stream, None)
            if kind == "error":
                self._warn(str(msg.get("code")).upper(), str(msg.get("message")))
            if stream == self.stream:
                self.stream = None
            if self._is_closing and self.stream is None:
                self.conn.request_close(1000, "")

    def _warn(self, code: str, description: str) -> None:
        self._send_json({"type": "Warning", "description": description, "code": code})

    def _send_json(self, obj: dict[str, Any]) -> None:
        self.conn.send(None, json.dumps(obj))

    def on_closed(self) -> None:
        for out in self.out.values():
            out.cancel()
        self.out.clear()
