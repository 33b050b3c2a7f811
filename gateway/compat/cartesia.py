"""Cartesia's text to speech over a ``Session``: the ``/tts/websocket`` contexts,
``POST /tts/bytes`` and ``POST /tts/sse``; docs/compat.md has the protocol.
"""

from __future__ import annotations

import base64
import json
import uuid
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from aiohttp import web

from gateway import protocol as p
from gateway.compat.audio_out import AudioEncoder, FormatError, OutputFormat, engine_sample_bytes
from gateway.compat.base import (HTTP_STATUS, CompatConnection, CompatError, StreamOut,
                                 VoiceNames, drive, is_one_of, load_json, native_refusal, read_body, retry_headers,
                                 serve_adapter, speech_options)
from gateway.compat.http_speech import Speech, speak
from gateway.compat.timing import Aligner, CharTiming, Word, flush_words, words_of

if TYPE_CHECKING:
    from gateway.server import Gateway

__all__ = ["add_routes", "PATHS", "cartesia_error", "rewrite_error"]

PATHS = ("/tts/websocket", "/tts/bytes", "/tts/sse")
_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
_ENCODINGS = {"pcm_s16le": "pcm_s16le", "pcm_f32le": "pcm_f32le", "pcm_mulaw": "mulaw",
              "pcm_alaw": "alaw"}
_IN_WAV = {"pcm_s16le": "wav", "pcm_mulaw": "wav_mulaw", "pcm_alaw": "wav_alaw"}
_MP3_BIT_RATES = (32000, 64000, 96000, 128000, 192000)
_SPEEDS = {"slowest": 0.6, "slow": 0.8, "normal": 1.0, "fast": 1.2, "fastest": 1.5}
_TITLES = {400: "Invalid request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found",
           405: "Method not allowed", 408: "Timeout", 413: "Request too large",
           429: "Too many requests"}


def add_routes(router: web.UrlDispatcher, gateway: Gateway, executor: Executor) -> None:
    route = _Route(gateway, executor)
    router.add_get("/tts/websocket", route.socket)
    router.add_post("/tts/bytes", route.bytes)
    router.add_post("/tts/sse", route.sse)


def _error_body(status: int, message: str, code: str | None) -> dict[str, Any]:
    return {"title": _TITLES.get(status, "Server error" if status >= 500 else "Error"),
            "message": message, "error_code": code, "status_code": status,
            "request_id": str(uuid.uuid4()), "doc_url": None}


def cartesia_error(status: int, message: str, *, code: str | None = None,
                   headers: Mapping[str, str] | None = None) -> web.Response:
    """An error in Cartesia's REST form."""
    return web.json_response(_error_body(status, message, code), status=status,
                             headers=dict(headers or {}))


def rewrite_error(response: web.StreamResponse) -> web.StreamResponse:
    """A native JSON refusal (admission, API key, Origin) or aiohttp's plain one in Cartesia's
    form."""
    return native_refusal(response, lambda body: "title" in body and "error_code" in body,
                          lambda status, message, code, headers: cartesia_error(status, message, code=code,
                                                                                headers=headers))


def _from_native(msg: dict[str, Any]) -> web.StreamResponse:
    code = str(msg.get("code") or "internal")
    return cartesia_error(HTTP_STATUS.get(code, 500), str(msg.get("message")), code=code,
                          headers=retry_headers(msg))


class _Words:
    """Word timings of one stream, in seconds from its first audio."""

    def __init__(self, engine_rate: int, bytes_per_sample: int) -> None:
        self._aligner = Aligner(engine_rate)
        self._rate = engine_rate
        self._bps = bytes_per_sample
        self._pending: list[CharTiming] = []
        self._text = ""

    def add_text(self, text: str) -> None:
        self._text += text
        self._aligner.set_text(self._text)

    def on_audio(self, msg: dict[str, Any]) -> list[Word]:
        span = msg.get("span")
        chars = self._aligner.on_chunk(tuple(span) if span else None, len(msg["pcm"]) // self._bps)
        return words_of(chars, pending=self._pending)

    def finish(self) -> list[Word]:
        return words_of(self._aligner.finish(), pending=self._pending) + flush_words(self._pending)

    def event(self, words: list[Word]) -> dict[str, Any]:
        return {"words": [w.text for w in words],
                "start": [round(w.start / self._rate, 3) for w in words],
                "end": [round(w.end / self._rate, 3) for w in words]}


@dataclass
class _Request:
    """A generation request's settings, checked."""

    fmt: OutputFormat
    voice: str | None
    options: dict[str, Any] = field(default_factory=dict)


class _Route:
    def __init__(self, gateway: Gateway, executor: Executor) -> None:
        self.gateway = gateway
        self.executor = executor
        self.voices = VoiceNames(gateway)

    def parse(self, msg: Mapping[str, Any], *, containers: tuple[str, ...]) -> _Request:
        """``model_id``, ``voice``, ``output_format`` and the speed of a request. Raises
        ``CompatError`` naming the field and what is accepted."""
        model = msg.get("model_id")
        if not isinstance(model, str) or not model:
            raise CompatError("bad_message", "'model_id' must be a model name (a string), e.g. "
                              "sonic-2", field="model_id")
        voice = msg.get("voice")
        if isinstance(voice, dict):
            if voice.get("mode", "id") != "id":
                raise CompatError("bad_message", "'voice.mode' must be 'id' (embeddings are not "
                                  "taken)", field="voice")
            voice = voice.get("id")
        if voice is None:
            raise CompatError("bad_message", "'voice' is required: {\"mode\": \"id\", \"id\": ...}",
                              field="voice")
        fmt = self._format(msg.get("output_format"), containers)
        speed = msg.get("speed")
        config = msg.get("generation_config")
        if isinstance(config, dict) and config.get("speed") is not None:
            speed = config["speed"]
        elif isinstance(speed, str):
            if speed not in _SPEEDS:
                raise CompatError("invalid_option", f"'speed' must be a number or one of "
                                  f"{list(_SPEEDS)}, got {p.show_value(speed)}", field="speed")
            speed = _SPEEDS[speed]
        elif isinstance(speed, (int, float)) and not isinstance(speed, bool) and speed <= 0:
            speed = None  # the older -1..1 scale: 0 and below are "normal" or slower; ignored
        return _Request(fmt, self.voices.resolve(voice, field="voice"),
                        speech_options(self.gateway, speed=speed))

    def _format(self, spec: Any, containers: tuple[str, ...]) -> OutputFormat:
        if not isinstance(spec, dict):
            raise CompatError("bad_message", "'output_format' is required: {\"container\": "
                              "\"raw\", \"encoding\": \"pcm_s16le\", \"sample_rate\": 24000}",
                              field="output_format")
        container = spec.get("container", "raw")
        if not is_one_of(container, containers):
            raise CompatError("unsupported_format", f"'output_format.container' must be one of "
                              f"{list(containers)}, got {p.show_value(container)}",
                              field="output_format.container")
        rate = spec.get("sample_rate")
        if not is_one_of(rate, _RATES) or isinstance(rate, bool):
            raise CompatError("unsupported_format", f"'output_format.sample_rate' must be one of "
                              f"{list(_RATES)}, got {p.show_value(rate)}",
                              field="output_format.sample_rate")
        if container == "mp3":
            bit_rate = spec.get("bit_rate", 128000)
            if not is_one_of(bit_rate, _MP3_BIT_RATES):
                raise CompatError("unsupported_format", f"'output_format.bit_rate' must be one "
                                  f"of {list(_MP3_BIT_RATES)}", field="output_format.bit_rate")
            return OutputFormat("mp3", rate, bit_rate)
        encoding = spec.get("encoding")
        accepted = _IN_WAV if container == "wav" else _ENCODINGS
        if not is_one_of(encoding, accepted):
            raise CompatError("unsupported_format", f"'output_format.encoding' for {container} "
                              f"must be one of {list(accepted)}, got {p.show_value(encoding)}",
                              field="output_format.encoding")
        return OutputFormat(accepted[encoding], rate)

    # --- REST ------------------------------------------------------------------------------

    async def _body(self, request: web.Request) -> dict[str, Any]:
        limit = self.gateway.config.max_frame_bytes
        raw = await read_body(request, limit)
        if len(raw) > limit:
            raise CompatError("frame_too_large", f"the request body is larger than {limit} bytes")
        body = load_json(raw)
        text = body.get("transcript")
        if not isinstance(text, str) or not text.strip() or not p._is_text(text):
            raise CompatError("bad_message", "'transcript' must be a non-empty string",
                              field="transcript")
        if len(text) > self.gateway.config.max_text_chars_per_stream:
            raise CompatError("text_too_long", "'transcript' is longer than "
                              f"{self.gateway.config.max_text_chars_per_stream} characters")
        return body

    async def _rest(self, request: web.Request, *, is_sse: bool) -> web.StreamResponse:
        try:
            body = await self._body(request)
            req = self.parse(body, containers=("raw",) if is_sse else ("raw", "wav", "mp3"))
        except (CompatError, FormatError) as exc:
            code = getattr(exc, "code", "unsupported_format")
            return cartesia_error(HTTP_STATUS.get(code, 400), str(exc), code=code)
        text = body["transcript"]
        enc = req.fmt.encoding
        ctype = ("text/event-stream" if is_sse else "audio/mpeg" if enc == "mp3" else
                 "audio/wav" if enc.startswith("wav") else "application/octet-stream")
        speech = Speech(text=text, voice=req.voice, fmt=req.fmt, content_type=ctype,
                        options=req.options, error=_from_native, refuse=rewrite_error)
        if is_sse:
            self._as_sse(speech, body)
        return await speak(self.gateway, request, self.executor, speech)

    def _as_sse(self, speech: Speech, body: dict[str, Any]) -> None:
        hello = self.gateway.engine.hello
        rate = hello.sample_rate if hello is not None else 24000
        context_id = body.get("context_id") if isinstance(body.get("context_id"), str) else None
        words = (_Words(rate, engine_sample_bytes(speech.fmt, rate)) if body.get("add_timestamps") is True
                 else None)
        if words is not None:
            words.add_text(speech.text)

        def frame(msg: dict[str, Any], data: bytes) -> bytes:
            out = _sse(_chunk(context_id, data)) if data else b""
            if words is not None:
                found = words.on_audio(msg)
                if found:
                    out += _sse(_timestamps(context_id, words.event(found)))
            return out

        def tail(data: bytes) -> bytes:
            out = _sse(_chunk(context_id, data)) if data else b""
            if words is not None:
                found = words.finish()
                if found:
                    out += _sse(_timestamps(context_id, words.event(found)))
            return out + _sse({"type": "done", "done": True, "status_code": 200,
                               "context_id": context_id})

        speech.frame = frame
        speech.tail = tail
        speech.mid_error = lambda msg: _sse(_error_event(context_id, msg))

    async def bytes(self, request: web.Request) -> web.StreamResponse:
        return await self._rest(request, is_sse=False)

    async def sse(self, request: web.Request) -> web.StreamResponse:
        return await self._rest(request, is_sse=True)

    # --- WebSocket -------------------------------------------------------------------------

    async def socket(self, request: web.Request) -> web.StreamResponse:
        gw = self.gateway

        def make(conn: CompatConnection) -> _Socket:
            return _Socket(self, conn)

        return await serve_adapter(gw, request, make, refuse=rewrite_error, not_websocket=lambda:
                                   cartesia_error(426, "/tts/websocket is a WebSocket: send an "
                                                  "Upgrade request"))


def _sse(event: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def _chunk(context_id: str | None, data: bytes) -> dict[str, Any]:
    return {"type": "chunk", "context_id": context_id, "data": base64.b64encode(data).decode(),
            "done": False, "status_code": 206, "step_time": 0.0}


def _timestamps(context_id: str | None, word_timestamps: dict[str, Any]) -> dict[str, Any]:
    return {"type": "timestamps", "context_id": context_id, "done": False, "status_code": 206,
            "word_timestamps": word_timestamps}


def _error_event(context_id: str | None, msg: dict[str, Any]) -> dict[str, Any]:
    code = str(msg.get("code") or "internal")
    body = _error_body(HTTP_STATUS.get(code, 500), str(msg.get("message")), code)
    return {"type": "error", "context_id": context_id, "done": True, **body}


@dataclass
class _Context:
    id: str
    stream: str  # the native stream
    out: StreamOut
    words: _Words | None
    num_flushes: int = 0
    num_flushes_done: int = 0
    is_ended: bool = False


class _Socket:
    """One Cartesia WebSocket: its contexts, each a native stream."""

    def __init__(self, route: _Route, conn: CompatConnection) -> None:
        self.route = route
        self.gateway = route.gateway
        self.conn = conn
        self._by_id: dict[str, _Context] = {}
        self._by_stream: dict[str, _Context] = {}
        self._num_streams = 0

    def on_frame(self, data: bytes | str) -> None:
        context_id: str | None = None
        try:
            msg = load_json(data)
            raw_id = msg.get("context_id")
            if raw_id is not None and (not isinstance(raw_id, str) or not raw_id
                                       or not p._is_text(raw_id) or len(raw_id) > 256):
                raise CompatError("bad_message", "'context_id' must be a non-empty string",
                                  field="context_id")
            context_id = raw_id
            if msg.get("cancel") is True:
                self._cancel(context_id)
                return
            self._generate(msg, context_id or str(uuid.uuid4()))
        except (CompatError, FormatError) as exc:
            code = getattr(exc, "code", "unsupported_format")
            self._send(_error_event(context_id, {"code": code, "message": str(exc)}))

    def _cancel(self, context_id: str | None) -> None:
        ctx = self._by_id.pop(context_id, None) if context_id is not None else None
        if ctx is None:
            return  # unknown or finished: nothing to stop, and nothing is sent
        self._by_stream.pop(ctx.stream, None)
        ctx.out.cancel()
        self.conn.drop(ctx.stream)
        drive(self.gateway, self.conn, p.Cancel(stream=ctx.stream))

    def _generate(self, msg: dict[str, Any], context_id: str) -> None:
        transcript = msg.get("transcript", "")
        if not isinstance(transcript, str) or not p._is_text(transcript):
            raise CompatError("bad_message", "'transcript' must be a string", field="transcript")
        ctx = self._by_id.get(context_id)
        if ctx is None:
            ctx = self._open(msg, context_id)
            if ctx is None:
                return
        elif ctx.is_ended:
            raise CompatError("stream_ended", f"context {p.show_value(context_id)} has had its "
                              "last input (continue: false); use a new context_id")
        if transcript:
            if ctx.words is not None:
                ctx.words.add_text(transcript)
            drive(self.gateway, self.conn, p.TextIn(stream=ctx.stream, text=transcript))
        if msg.get("flush") is True and ctx.id in self._by_id:
            ctx.num_flushes += 1
            drive(self.gateway, self.conn, p.Flush(stream=ctx.stream))
        if msg.get("continue") is not True and ctx.id in self._by_id:
            ctx.is_ended = True
            drive(self.gateway, self.conn, p.End(stream=ctx.stream))

    def _open(self, msg: dict[str, Any], context_id: str) -> _Context | None:
        req = self.route.parse(msg, containers=("raw",))
        hello = self.gateway.engine.hello
        rate = hello.sample_rate if hello is not None else 24000
        encoder = AudioEncoder(req.fmt, input_rate=rate)
        self._num_streams += 1
        stream = f"ct-{self._num_streams}"
        words = None
        if msg.get("add_timestamps") is True:
            words = _Words(rate, 2 if encoder.engine_format == "pcm_s16le" else 4)
        out = StreamOut(encoder, lambda m, d: self._emit(stream, m, d), executor=None,
                        max_pending_bytes=self.gateway.config.max_outbox_bytes,
                        on_overflow=lambda: self.gateway.on_slow_consumer(self.conn))
        ctx = _Context(context_id, stream, out, words)
        self._by_id[context_id] = ctx
        self._by_stream[stream] = ctx
        drive(self.gateway, self.conn, p.Start(stream=stream, voice=req.voice,
                                               format=encoder.engine_format, options=req.options))
        return ctx if ctx.id in self._by_id else None

    def on_native(self, msg: dict[str, Any]) -> None:
        stream = msg.get("stream")
        ctx = self._by_stream.get(stream) if stream is not None else None
        if ctx is not None:
            ctx.out.put(msg)
        elif msg.get("type") == "error" and stream is None:  # connection-wide
            self._send(_error_event(None, msg))

    def _emit(self, stream: str, msg: dict[str, Any], data: bytes) -> None:
        ctx = self._by_stream.get(stream)
        if ctx is None:
            return
        kind = msg.get("type")
        if kind == "flushed":
            data = ctx.out.flush_tail()
        if data:
            self._send(_chunk(ctx.id, data), stream)
        if ctx.words is not None:
            found = ctx.words.on_audio(msg) if kind == "audio" else (
                ctx.words.finish() if kind == "done" else [])
            if found:
                self._send(_timestamps(ctx.id, ctx.words.event(found)), stream)
        if kind == "flushed":
            ctx.num_flushes_done += 1
            self._send({"type": "flush_done", "context_id": ctx.id, "done": False,
                        "flush_done": True, "flush_id": ctx.num_flushes_done,
                        "status_code": 206}, stream)
        elif kind in ("done", "error"):
            self._by_stream.pop(stream, None)
            if self._by_id.get(ctx.id) is ctx:
                del self._by_id[ctx.id]
            if kind == "done" and msg.get("reason") == "end":
                self._send({"type": "done", "context_id": ctx.id, "done": True,
                            "status_code": 200}, stream)
            elif kind == "error":
                self._send(_error_event(ctx.id, msg), stream)

    def _send(self, event: dict[str, Any], stream: str | None = None) -> None:
        self.conn.send(stream, json.dumps(event))

    def on_closed(self) -> None:
        for ctx in self._by_stream.values():
            ctx.out.cancel()
        self._by_stream.clear()
        self._by_id.clear()
