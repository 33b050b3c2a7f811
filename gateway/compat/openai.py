"""OpenAI's ``POST /v1/audio/speech`` over a ``Session``: one request, one stream
(docs/compat.md).
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gateway import protocol as p
from gateway.compat.audio_out import OutputFormat
from gateway.compat.base import HTTP_STATUS, CompatError, VoiceNames, is_one_of, read_body, speech_options
from gateway.compat.http_speech import Speech, speak

if TYPE_CHECKING:
    from gateway.server import Gateway

__all__ = ["SpeechRoute", "openai_error", "rewrite_error"]

log = logging.getLogger("voxgate.compat")

PATH = "/v1/audio/speech"
_FORMATS = {  # response_format -> (encoding, content type)
    "mp3": ("mp3", "audio/mpeg"),
    "opus": ("opus", "audio/ogg"),
    "aac": ("aac", "audio/aac"),
    "flac": ("flac", "audio/flac"),
    "wav": ("wav", "audio/wav"),
    "pcm": ("pcm_s16le", "audio/pcm"),
}
_FIELDS = ("model", "input", "voice", "instructions", "response_format", "speed", "stream_format")
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error",
          413: "invalid_request_error", 415: "invalid_request_error",
          429: "rate_limit_error"}


def openai_error(status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> web.Response:
    """An error in OpenAI's form."""
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return web.json_response({"error": {"message": message, "type": kind, "param": param,
                                        "code": code}}, status=status, headers=headers)


def rewrite_error(response: web.StreamResponse) -> web.StreamResponse:
    """A native ``{"error": {"code", "message", ...}}`` response (the security checks, the
    admission refusals) or aiohttp's plain one (404, 405, 413) in OpenAI's form."""
    if response.status < 400 or not isinstance(response, web.Response):
        return response
    code, message = None, response.reason or "error"
    try:
        body = json.loads(response.text or "")
        if "type" in body["error"] and "param" in body["error"]:
            return response  # in OpenAI's form already (the route's own errors)
        code, message = body["error"]["code"], body["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = (response.text or message).strip()
    headers = {k: v for k, v in response.headers.items()
               if k in ("Retry-After", "WWW-Authenticate", "Allow")}
    return openai_error(response.status, message, code=code, headers=headers)


class SpeechRoute:
    """The handler of ``POST /v1/audio/speech``."""

    def __init__(self, gateway: Gateway, executor: Executor) -> None:
        self.gateway = gateway
        self.executor = executor
        self.voices = VoiceNames(gateway)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """The speech, or an OpenAI error; either carries an ``x-request-id`` as OpenAI's do (its
        SDK reads it, LiveKit's plugin logs a warning without it)."""
        request_id = "req_" + uuid.uuid4().hex
        response = await self._handle(request, request_id)
        if not response.prepared:  # (a streamed speech was sent with it)
            response.headers["x-request-id"] = request_id
        return response

    async def _handle(self, request: web.Request, request_id: str) -> web.StreamResponse:
        gw = self.gateway
        limit = gw.config.max_frame_bytes
        if request.content_length is not None and request.content_length > limit:
            return openai_error(413, f"the request body is larger than {limit} bytes "
                                "(--max-frame-bytes)", code="request_too_large")
        try:
            raw = await read_body(request, limit)
        except Exception:
            return openai_error(400, "the request body could not be read")
        if len(raw) > limit:
            return openai_error(413, f"the request body is larger than {limit} bytes "
                                "(--max-frame-bytes)", code="request_too_large")
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            return openai_error(400, "the request body is not valid JSON")
        try:
            req = self._parse(body)
        except CompatError as exc:
            return openai_error(400, exc.message, param=exc.field, code=exc.code)
        return await self._speak(request, request_id, *req)

    def _parse(self, body: Any) -> tuple[str, str | None, str, bool, dict[str, Any]]:
        if not isinstance(body, dict):
            raise CompatError("bad_message", "the request body must be a JSON object")
        for name in body:
            if name not in _FIELDS:
                raise CompatError("unknown_parameter", f"Unrecognized request argument supplied: "
                                  f"{p.show_value(name)}; accepted: {list(_FIELDS)}",
                                  field=str(name)[:64])
        text = body.get("input")
        if not isinstance(text, str) or not text.strip() or not p._is_text(text):
            raise CompatError("invalid_value", "'input' must be a non-empty string", field="input")
        max_chars = self.gateway.config.max_text_chars_per_stream
        if len(text) > max_chars:  # refused before any work
            raise CompatError("string_above_max_length", f"'input' is longer than {max_chars} "
                              "characters (--max-text-chars-per-stream)", field="input")
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise CompatError("invalid_type", "'model' must be a string", field="model")
        voice = body.get("voice")
        if isinstance(voice, dict):
            if set(voice) - {"id"}:
                raise CompatError("invalid_value", "'voice' as an object takes only 'id'",
                                  field="voice")
            voice = voice.get("id")
        voice = self.voices.resolve(voice, field="voice")
        fmt = body.get("response_format", "mp3")
        if not is_one_of(fmt, _FORMATS):
            raise CompatError("invalid_value", f"'response_format' must be one of "
                              f"{list(_FORMATS)}, got {p.show_value(fmt)}", field="response_format")
        stream_format = body.get("stream_format", "audio")
        if not is_one_of(stream_format, ("audio", "sse")):
            raise CompatError("invalid_value", "'stream_format' must be 'audio' or 'sse', got "
                              f"{p.show_value(stream_format)}", field="stream_format")
        speed = body.get("speed")
        if isinstance(speed, str):  # OpenAI takes a number only
            raise CompatError("invalid_type", "'speed' must be a number in [0.25, 4.0]",
                              field="speed")
        # OpenAI's range is 0.25-4; the model's own (hello.options) clips it
        options: dict[str, Any] = speech_options(self.gateway, speed=speed)
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise CompatError("invalid_type", "'instructions' must be a string",
                              field="instructions")
        declared = self.gateway.engine.hello.options if self.gateway.engine.hello else {}
        if instructions and "instructions" in declared:
            options["instructions"] = instructions
        options = {k: v for k, v in options.items() if k in declared}  # others: not this model's
        return text, voice, fmt, stream_format == "sse", options

    async def _speak(self, request: web.Request, request_id: str, text: str, voice: str | None, fmt: str,
                     is_sse: bool, options: dict[str, Any]) -> web.StreamResponse:
        hello = self.gateway.engine.hello
        rate = hello.sample_rate if hello is not None else 24000
        encoding, ctype = _FORMATS[fmt]
        words = len(text.split())
        speech = Speech(text=text, voice=voice, options=options,
                        fmt=OutputFormat(encoding, 24000 if fmt == "pcm" else rate),
                        content_type="text/event-stream" if is_sse else ctype,
                        error=_native_error, refuse=rewrite_error, headers={"x-request-id": request_id})
        if is_sse:
            speech.frame = lambda msg, data: _sse({
                "type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}) \
                if data else b""
            speech.tail = lambda data: (speech.frame({}, data) if data else b"") + _sse({
                "type": "speech.audio.done", "usage": {
                    "input_tokens": words, "output_tokens": 0, "total_tokens": words}})
            speech.mid_error = lambda msg: _sse({"type": "error", "error": {
                "message": msg.get("message"), "code": msg.get("code")}})
        return await speak(self.gateway, request, self.executor, speech)


def _sse(event: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def _native_error(msg: dict[str, Any]) -> web.Response:
    code = str(msg.get("code") or "internal")
    status = HTTP_STATUS.get(code, 500)
    headers = {}
    if msg.get("retryable"):
        headers["Retry-After"] = str(max(1, round(msg.get("retry_after_s") or 1)))
    param = {"unknown_voice": "voice", "invalid_option": "speed", "text_too_long": "input",
             "unsupported_format": "response_format"}.get(code)
    return openai_error(status, str(msg.get("message")), param=param, code=code,
                        headers=headers)
