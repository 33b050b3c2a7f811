"""ElevenLabs' text to speech over a ``Session``: the WebSockets
``/v1/text-to-speech/{voice_id}/stream-input`` and ``/multi-stream-input`` and the REST routes
``POST /v1/text-to-speech/{voice_id}``, ``.../stream`` and their ``/with-timestamps`` forms;
docs/compat.md has the protocol.
"""

from __future__ import annotations

import base64
import json
import re
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from aiohttp import web

from gateway import protocol as p
from gateway.compat.audio_out import AudioEncoder, FormatError, OutputFormat, engine_sample_bytes
from gateway.compat.base import (HTTP_STATUS, CompatConnection, CompatError, StreamOut,
                                 VoiceNames, drive, load_json, native_refusal, read_body, retry_headers,
                                 serve_adapter, speech_options)
from gateway.compat.http_speech import Speech, speak
from gateway.compat.timing import Aligner, CharTiming

if TYPE_CHECKING:
    from gateway.server import Gateway

__all__ = ["add_routes", "PREFIX", "elevenlabs_error", "rewrite_error", "parse_output_format"]

PREFIX = "/v1/text-to-speech/"
_PCM_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
_BIT_RATES = (32, 64, 96, 128, 192)
_FORMAT = re.compile(r"^(pcm|ulaw|alaw|mp3|opus)_(\d+)(?:_(\d+))?$")
_CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "mulaw": "audio/basic",
                  "alaw": "audio/x-alaw-basic", "pcm_s16le": "audio/pcm"}
_DEFAULT_CONTEXT = ""
# .../with-timestamps answers in one JSON object, so it holds the audio until the end: about five
# minutes of speech at most (the streamed form has the connection's limits).
_WHOLE_MAX_CHARS = 5_000


def add_routes(router: web.UrlDispatcher, gateway: Gateway, executor: Executor) -> None:
    route = _Route(gateway, executor)
    router.add_get(PREFIX + "{voice_id}/stream-input", route.stream_input)
    router.add_get(PREFIX + "{voice_id}/multi-stream-input", route.multi_stream_input)
    router.add_post(PREFIX + "{voice_id}", route.rest)
    router.add_post(PREFIX + "{voice_id}/stream", route.rest)
    router.add_post(PREFIX + "{voice_id}/with-timestamps", route.rest_with_timestamps)
    router.add_post(PREFIX + "{voice_id}/stream/with-timestamps", route.rest_with_timestamps)


def parse_output_format(name: str) -> OutputFormat:
    """An ElevenLabs ``output_format`` name as an ``OutputFormat``; ``CompatError`` naming the
    accepted names otherwise."""
    accepted = (f"pcm_8000 … pcm_48000 ({', '.join(map(str, _PCM_RATES))}), ulaw_8000, alaw_8000,"
                " mp3_22050_32, mp3_44100_{32,64,96,128,192}, opus_48000_{32,64,96,128,192}")
    match = _FORMAT.match(name or "")
    if match is None:
        raise CompatError("unsupported_format", f"'output_format' must be one of {accepted}, "
                          f"got {p.show_value(name)}", field="output_format")
    kind, rate, kbps = match.group(1), int(match.group(2)), match.group(3)
    ok = ((kind == "pcm" and rate in _PCM_RATES and kbps is None)
          or (kind in ("ulaw", "alaw") and rate == 8000 and kbps is None)
          or (kind == "mp3" and ((rate == 22050 and kbps == "32")
                                 or (rate == 44100 and kbps and int(kbps) in _BIT_RATES)))
          or (kind == "opus" and rate == 48000 and kbps and int(kbps) in _BIT_RATES))
    if not ok:
        raise CompatError("unsupported_format", f"'output_format' must be one of {accepted}, "
                          f"got {p.show_value(name)}", field="output_format")
    encoding = {"pcm": "pcm_s16le", "ulaw": "mulaw", "alaw": "alaw"}.get(kind, kind)
    if kind == "opus":
        rate = 24000  # Ogg Opus always decodes at 48 kHz; the encoder takes the engine's rate
    return OutputFormat(encoding, rate, int(kbps) * 1000 if kbps else 0)


def elevenlabs_error(status: int, message: str, *, code: str,
                     headers: Mapping[str, str] | None = None) -> web.Response:
    """An error in ElevenLabs' REST form."""
    return web.json_response({"detail": {"status": code, "message": message}}, status=status,
                             headers=dict(headers or {}))


def rewrite_error(response: web.StreamResponse) -> web.StreamResponse:
    """A native JSON refusal (admission, API key, Origin) or aiohttp's plain one in ElevenLabs'
    form."""
    return native_refusal(response, lambda body: "detail" in body,
                          lambda status, message, code, headers: elevenlabs_error(status, message, code=code or "error",
                                                                                  headers=headers))


def _from_native(msg: dict[str, Any]) -> web.StreamResponse:
    code = str(msg.get("code") or "internal")
    return elevenlabs_error(HTTP_STATUS.get(code, 500), str(msg.get("message")), code=code,
                            headers=retry_headers(msg))


def _speed(gateway: Gateway, settings: Any) -> dict[str, Any]:
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        raise CompatError("bad_message", "'voice_settings' must be an object", field="voice_settings")
    return speech_options(gateway, speed=settings.get("speed"), field="voice_settings.speed")


@dataclass
class _Query:
    fmt: OutputFormat
    voice: str | None
    options: dict[str, Any] = field(default_factory=dict)
    inactivity_timeout_s: float = 20.0


class _Route:
    def __init__(self, gateway: Gateway, executor: Executor) -> None:
        self.gateway = gateway
        self.executor = executor
        self.voices = VoiceNames(gateway)

    def _query(self, request: web.Request) -> _Query:
        q = request.query
        fmt = parse_output_format(q.get("output_format") or "mp3_44100_128")
        voice = self.voices.resolve(request.match_info["voice_id"], field="voice_id")
        timeout = q.get("inactivity_timeout")
        timeout_s = 20.0
        if timeout:
            try:
                timeout_s = float(timeout)
            except ValueError:
                timeout_s = -1.0
            if not 1 <= timeout_s <= 180:
                raise CompatError("invalid_option", "'inactivity_timeout' must be a number of "
                                  f"seconds in [1, 180], got {p.show_value(timeout)}",
                                  field="inactivity_timeout")
        options: dict[str, Any] = {}
        seed = q.get("seed")
        hello = self.gateway.engine.hello
        if seed and seed.isdigit() and hello is not None and "seed" in hello.options:
            options["seed"] = int(seed)
        return _Query(fmt, voice, options, timeout_s)

    async def rest(self, request: web.Request) -> web.StreamResponse:
        speech = await self._rest_speech(request)
        if isinstance(speech, web.StreamResponse):
            return speech
        return await speak(self.gateway, request, self.executor, speech)

    async def rest_with_timestamps(self, request: web.Request) -> web.StreamResponse:
        """The audio as base64 in JSON with each character's start and end, in seconds from the
        start of the audio: one object, or (``/stream/with-timestamps``) one a line as it is made."""
        speech = await self._rest_speech(request)
        if isinstance(speech, web.StreamResponse):
            return speech
        is_streamed = request.path.endswith("/stream/with-timestamps")
        if not is_streamed and len(speech.text) > _WHOLE_MAX_CHARS:  # (its audio is held until the end)
            return elevenlabs_error(400, f"'text' is longer than {_WHOLE_MAX_CHARS} characters for an answer "
                                    "in one piece: use .../stream/with-timestamps", code="text_too_long")
        hello = self.gateway.engine.hello
        _with_timestamps(speech, hello.sample_rate if hello is not None else 24000, is_streamed=is_streamed)
        return await speak(self.gateway, request, self.executor, speech)

    async def _rest_speech(self, request: web.Request) -> Speech | web.StreamResponse:
        """The request as a ``Speech``, or the ElevenLabs error that refuses it."""
        gw = self.gateway
        try:
            query = self._query(request)
            limit = gw.config.max_frame_bytes
            raw = await read_body(request, limit)
            if len(raw) > limit:
                raise CompatError("frame_too_large", f"the request body is larger than {limit} "
                                  "bytes")
            body = load_json(raw)
            text = body.get("text")
            if not isinstance(text, str) or not text.strip() or not p._is_text(text):
                raise CompatError("bad_message", "'text' must be a non-empty string", field="text")
            if len(text) > gw.config.max_text_chars_per_stream:
                raise CompatError("text_too_long", "'text' is longer than "
                                  f"{gw.config.max_text_chars_per_stream} characters", field="text")
            options = {**query.options, **_speed(gw, body.get("voice_settings"))}
            if isinstance(body.get("seed"), int) and gw.engine.hello is not None \
                    and "seed" in gw.engine.hello.options:
                options["seed"] = body["seed"]
        except (CompatError, FormatError) as exc:
            code = getattr(exc, "code", "unsupported_format")
            status = HTTP_STATUS.get(code, 400)
            return elevenlabs_error(status, str(exc), code=code)
        return Speech(text=text, voice=query.voice, fmt=query.fmt, options=options,
                      content_type=_CONTENT_TYPES.get(query.fmt.encoding, "application/octet-stream"),
                      error=_from_native, refuse=rewrite_error)

    async def stream_input(self, request: web.Request) -> web.StreamResponse:
        return await self._socket(request, is_multi=False)

    async def multi_stream_input(self, request: web.Request) -> web.StreamResponse:
        return await self._socket(request, is_multi=True)

    async def _socket(self, request: web.Request, *, is_multi: bool) -> web.StreamResponse:
        try:
            query = self._query(request)
        except (CompatError, FormatError) as exc:
            return elevenlabs_error(400, str(exc), code=getattr(exc, "code", "unsupported_format"))

        def make(conn: CompatConnection) -> _Socket:
            return _Socket(self, conn, query, is_multi=is_multi)

        return await serve_adapter(self.gateway, request, make, refuse=rewrite_error,
                                   not_websocket=lambda: elevenlabs_error(
                                       426, "this is a WebSocket endpoint: send an Upgrade request",
                                       code="upgrade_required"),
                                   idle_timeout_s=query.inactivity_timeout_s)


def _with_timestamps(speech: Speech, engine_rate: int, *, is_streamed: bool) -> None:
    """Frame ``speech`` as ElevenLabs' with-timestamps answers: ``{"audio_base64", "alignment",
    "normalized_alignment"}`` (the same: voxgate does not normalise), the alignment's
    ``characters`` with their ``character_start_times_seconds`` / ``..._end_times_seconds``
    counted from the start of the request's audio; streamed, one such object a line."""
    aligner = Aligner(engine_rate)
    aligner.set_text(speech.text)
    sample_bytes = engine_sample_bytes(speech.fmt, engine_rate)
    timed: list[CharTiming] = []  # characters not yet sent
    audio = bytearray()  # the whole answer's audio

    def on_audio(msg: dict[str, Any]) -> None:
        span = msg.get("span")
        timed.extend(aligner.on_chunk(tuple(span) if span else None, len(msg["pcm"]) // sample_bytes))

    def answer(data: bytes | bytearray) -> bytes:
        chars = timed[:]
        timed.clear()
        alignment = None if not chars else {
            "characters": [c.char for c in chars],
            "character_start_times_seconds": [round(c.start / engine_rate, 3) for c in chars],
            "character_end_times_seconds": [round((c.start + c.duration) / engine_rate, 3) for c in chars]}
        return json.dumps({"audio_base64": base64.b64encode(data).decode(), "alignment": alignment,
                           "normalized_alignment": alignment}).encode()

    def frame(msg: dict[str, Any], data: bytes) -> bytes:
        on_audio(msg)
        if not is_streamed:
            audio.extend(data)
            return b""  # (the answer, and its status, at the end)
        return answer(data) + b"\n" if data else b""  # (characters wait for their audio)

    def tail(data: bytes) -> bytes:
        timed.extend(aligner.finish())
        if not is_streamed:
            return answer(audio + data)
        return answer(data) + b"\n" if data or timed else b""

    def mid_error(msg: dict[str, Any]) -> bytes:
        return json.dumps({"detail": {"status": str(msg.get("code") or "internal"),
                                      "message": str(msg.get("message"))}}).encode() + b"\n"

    speech.content_type = "application/json"
    speech.frame, speech.tail, speech.mid_error = frame, tail, mid_error


@dataclass
class _Context:
    id: str
    stream: str
    out: StreamOut
    aligner: Aligner
    bytes_per_sample: int
    text: str = ""
    is_flushed: bool = False  # the last input was a flush (close_context then finishes)
    is_closing: bool = False  # close_context or end of input: isFinal after done
    pending: list[CharTiming] = field(default_factory=list)  # timed, not yet sent


class _Socket:
    """One ElevenLabs WebSocket: its contexts (one on stream-input), each a native stream."""

    def __init__(self, route: _Route, conn: CompatConnection, query: _Query, *,
                 is_multi: bool) -> None:
        self.route = route
        self.gateway = route.gateway
        self.conn = conn
        self.query = query
        self.is_multi = is_multi
        self._by_id: dict[str, _Context] = {}
        self._by_stream: dict[str, _Context] = {}
        self._num_streams = 0
        self._is_closing = False  # close_socket (or stream-input's end): close once all are done
        self._has_started = False  # stream-input: its one context was opened

    # --- client frames ---------------------------------------------------------------------

    def on_frame(self, data: bytes | str) -> None:
        context_id: str | None = None
        try:
            msg = load_json(data)
            raw_id = msg.get("context_id", msg.get("contextId"))
            if raw_id is not None and (not isinstance(raw_id, str) or not p._is_text(raw_id)
                                       or len(raw_id) > 256):
                raise CompatError("bad_message", "'context_id' must be a string",
                                  field="context_id")
            context_id = raw_id if self.is_multi and raw_id else _DEFAULT_CONTEXT
            self._on_message(msg, context_id)
        except (CompatError, FormatError) as exc:
            self._error(context_id, getattr(exc, "code", "bad_message"), str(exc))

    def _on_message(self, msg: dict[str, Any], context_id: str) -> None:
        if self._is_closing:
            raise CompatError("bad_message", "the socket is closing (close_socket was sent)")
        if msg.get("close_socket") is True:
            self._close_socket()
            return
        ctx = self._by_id.get(context_id)
        if msg.get("close_context") is True:
            if ctx is not None:
                self._close_context(ctx)
            return
        text = msg.get("text")
        if text is not None and (not isinstance(text, str) or not p._is_text(text)):
            raise CompatError("bad_message", "'text' must be a string", field="text")
        if not self.is_multi and text == "" and self._has_started:
            if ctx is not None:  # stream-input: the end of input
                ctx.is_closing = True
                self._drive(p.End(stream=ctx.stream))
            self._is_closing = True
            self._close_if_done()
            return
        if ctx is None:
            if not text and msg.get("flush") is not True:
                return  # a keep-alive, or an empty first frame: nothing to open
            if not self.is_multi and self._has_started:
                raise CompatError("bad_message", "the input has ended")
            ctx = self._open(context_id, msg.get("voice_settings"))
            if ctx is None:
                return
            if text and not text.strip():
                text = ""  # the opening " " (ElevenLabs' custom) is not spoken text
        if text:
            ctx.text += text
            ctx.aligner.set_text(ctx.text)
            ctx.is_flushed = False
            self._drive(p.TextIn(stream=ctx.stream, text=text))
        if msg.get("flush") is True and ctx.id in self._by_id:
            ctx.is_flushed = True
            self._drive(p.Flush(stream=ctx.stream))

    def _open(self, context_id: str, voice_settings: Any) -> _Context | None:
        options = {**self.query.options, **_speed(self.gateway, voice_settings)}
        hello = self.gateway.engine.hello
        rate = hello.sample_rate if hello is not None else 24000
        encoder = AudioEncoder(self.query.fmt, input_rate=rate)
        self._num_streams += 1
        self._has_started = True
        stream = f"el-{self._num_streams}"
        out = StreamOut(encoder, lambda m, d: self._emit(stream, m, d),
                        executor=self.route.executor,
                        max_pending_bytes=self.gateway.config.max_outbox_bytes,
                        on_overflow=lambda: self.gateway.on_slow_consumer(self.conn))
        ctx = _Context(context_id, stream, out, Aligner(rate),
                       2 if encoder.engine_format == "pcm_s16le" else 4)
        self._by_id[context_id] = ctx
        self._by_stream[stream] = ctx
        self._drive(p.Start(stream=stream, voice=self.query.voice, format=encoder.engine_format,
                            options=options))
        return ctx if self._by_id.get(context_id) is ctx else None

    def _close_context(self, ctx: _Context) -> None:
        if ctx.is_closing:
            return
        if ctx.is_flushed or not ctx.text:  # all its input was flushed: finish, then isFinal
            ctx.is_closing = True
            self._drive(p.End(stream=ctx.stream))
            return
        self._forget(ctx)  # barge-in: nothing more for it
        ctx.out.cancel()
        self.conn.drop(ctx.stream)
        self._drive(p.Cancel(stream=ctx.stream))

    def _close_socket(self) -> None:
        self._is_closing = True
        for ctx in list(self._by_id.values()):
            if not ctx.is_closing:
                ctx.is_closing = True
                self._drive(p.End(stream=ctx.stream))
        self._close_if_done()

    def _close_if_done(self) -> None:
        if self._is_closing and not self._by_stream:
            self.conn.request_close(1000, "")

    def _drive(self, msg: p.ClientMessage) -> None:
        drive(self.gateway, self.conn, msg)

    def _forget(self, ctx: _Context) -> None:
        self._by_stream.pop(ctx.stream, None)
        if self._by_id.get(ctx.id) is ctx:
            del self._by_id[ctx.id]

    # --- what the session sends ------------------------------------------------------------

    def on_native(self, msg: dict[str, Any]) -> None:
        stream = msg.get("stream")
        ctx = self._by_stream.get(stream) if stream is not None else None
        if ctx is not None:
            ctx.out.put(msg)
        elif msg.get("type") == "error" and stream is None:  # connection-wide
            self._error(None, str(msg.get("code")), str(msg.get("message")))

    def _emit(self, stream: str, msg: dict[str, Any], data: bytes) -> None:
        ctx = self._by_stream.get(stream)
        if ctx is None:
            return
        kind = msg.get("type")
        if kind == "audio":
            span = msg.get("span")
            ctx.pending += ctx.aligner.on_chunk(tuple(span) if span else None,
                                                len(msg["pcm"]) // ctx.bytes_per_sample)
            if data:
                self._audio(ctx, data, chunk_start=int(msg.get("offset") or 0))
        elif kind == "flushed":
            tail = ctx.out.flush_tail()
            if tail:
                self._audio(ctx, tail, chunk_start=None)
        elif kind == "done":
            ctx.pending += ctx.aligner.finish()
            if data or ctx.pending:
                self._audio(ctx, data, chunk_start=None)
            self._forget(ctx)
            if msg.get("reason") == "end":
                self._send(self._frame(ctx, {"isFinal": True}), stream)
            self._close_if_done()
        elif kind == "error":
            self._forget(ctx)
            self._error(ctx.id, str(msg.get("code")), str(msg.get("message")))
            self._close_if_done()

    def _audio(self, ctx: _Context, data: bytes, *, chunk_start: int | None) -> None:
        rate = ctx.aligner.sample_rate
        chars, ctx.pending = ctx.pending, []
        if chunk_start is None:
            chunk_start = min((c.start for c in chars), default=0)
        alignment = None
        if chars:
            alignment = {
                "chars": [c.char for c in chars],
                "charStartTimesMs": [max(0, round((c.start - chunk_start) * 1000 / rate))
                                     for c in chars],
                "charDurationsMs": [round(c.duration * 1000 / rate) for c in chars],
            }
        self._send(self._frame(ctx, {"audio": base64.b64encode(data).decode(), "isFinal": None,
                                     "alignment": alignment, "normalizedAlignment": alignment}),
                   ctx.stream)

    def _frame(self, ctx: _Context, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "contextId": ctx.id} if self.is_multi else body

    def _error(self, context_id: str | None, code: str, message: str) -> None:
        frame: dict[str, Any] = {"message": message, "error": code,
                                 "code": HTTP_STATUS.get(code, 400)}
        if self.is_multi and context_id:
            frame["contextId"] = context_id
        self._send(frame)

    def _send(self, frame: dict[str, Any], stream: str | None = None) -> None:
        self.conn.send(stream, json.dumps(frame))

    def on_closed(self) -> None:
        for ctx in self._by_stream.values():
            ctx.out.cancel()
        self._by_stream.clear()
        self._by_id.clear()
