"""The client <-> gateway wire protocol (v1): the only module that builds or parses its frames.

A frame is a map with a ``type``. Clients send binary msgpack frames or JSON text frames; the
server answers in msgpack unless the connection asked for ``?encoding=json`` (then PCM travels
base64-encoded in ``pcm``). See docs/protocol.md for the whole protocol with examples.
"""

from __future__ import annotations

import base64
import enum
import json
import math
from dataclasses import dataclass, field
from typing import Any

import msgpack

__all__ = [
    "PROTOCOL_VERSION",
    "FORMATS",
    "Encoding",
    "ErrorCode",
    "ProtocolError",
    "ClientMessage",
    "Start",
    "TextIn",
    "Flush",
    "End",
    "Cancel",
    "parse_client_frame",
    "encode_server_message",
    "decode_server_frame",
    "encode_client_message",
    "hello",
    "ready",
    "audio",
    "done",
    "error",
]

PROTOCOL_VERSION = 1
FORMATS = ("pcm_s16le", "pcm_f32le")
MAX_STREAM_ID_CHARS = 128


class Encoding(enum.Enum):
    MSGPACK = "msgpack"
    JSON = "json"


class ErrorCode(str, enum.Enum):
    """Error codes a client can act on. ``retryable`` says whether sending the same again may work."""

    BAD_MESSAGE = "bad_message"  # not msgpack/JSON, not a map, missing or wrong-typed field
    UNKNOWN_TYPE = "unknown_type"
    UNKNOWN_STREAM = "unknown_stream"  # text/flush/end/cancel for a stream never started
    STREAM_EXISTS = "stream_exists"  # start with an id that is still active
    STREAM_ENDED = "stream_ended"  # text after end
    UNKNOWN_VOICE = "unknown_voice"
    INVALID_OPTION = "invalid_option"
    UNSUPPORTED_FORMAT = "unsupported_format"
    TEXT_TOO_LONG = "text_too_long"
    TOO_MANY_STREAMS = "too_many_streams"
    FRAME_TOO_LARGE = "frame_too_large"
    IDLE_TIMEOUT = "idle_timeout"
    SLOW_CONSUMER = "slow_consumer"
    CAPACITY = "capacity"  # the engine is full; retry later
    ENGINE_RESTARTED = "engine_restarted"  # the engine died; the stream is lost, retry
    ENGINE_UNAVAILABLE = "engine_unavailable"  # the engine is (re)starting
    SERVER_SHUTDOWN = "server_shutdown"  # the server is stopping; retry on another
    MODEL_ERROR = "model_error"
    INTERNAL = "internal"


class ProtocolError(Exception):
    """A client frame that cannot be accepted. Becomes an ``error`` message for the client."""

    def __init__(
        self, code: ErrorCode, message: str, *, stream: str | None = None, retryable: bool = False
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.stream = stream
        self.retryable = retryable


# --- client -> server ------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientMessage:
    stream: str


@dataclass(frozen=True)
class Start(ClientMessage):
    voice: str | None = None
    format: str = "pcm_s16le"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TextIn(ClientMessage):
    text: str = ""


@dataclass(frozen=True)
class Flush(ClientMessage):
    pass


@dataclass(frozen=True)
class End(ClientMessage):
    pass


@dataclass(frozen=True)
class Cancel(ClientMessage):
    pass


_CLIENT_TYPES: dict[str, type[ClientMessage]] = {
    "start": Start,
    "text": TextIn,
    "flush": Flush,
    "end": End,
    "cancel": Cancel,
}


def _load(frame: bytes | str) -> Any:
    if isinstance(frame, str):
        try:
            return json.loads(frame)
        except ValueError as exc:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"text frame is not JSON: {exc}") from None
    try:
        return msgpack.unpackb(frame, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"binary frame is not msgpack: {exc}") from None


def parse_client_frame(frame: bytes | str) -> ClientMessage:
    """Decode and validate one client frame. Raises ``ProtocolError``."""
    obj = _load(frame)
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "a frame must be a map with a 'type'")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "missing 'type' (a string)")
    cls = _CLIENT_TYPES.get(kind)
    if cls is None:
        raise ProtocolError(
            ErrorCode.UNKNOWN_TYPE,
            f"unknown type {kind!r}; expected one of {sorted(_CLIENT_TYPES)}",
        )
    stream = obj.get("stream")
    if isinstance(stream, int) and not isinstance(stream, bool):
        stream = str(stream)
    if not isinstance(stream, str) or not stream or len(stream) > MAX_STREAM_ID_CHARS:
        raise ProtocolError(
            ErrorCode.BAD_MESSAGE,
            f"'stream' must be a non-empty string of at most {MAX_STREAM_ID_CHARS} characters",
        )
    if cls is TextIn:
        text = obj.get("text")
        if not isinstance(text, str):
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "'text' must be a string", stream=stream)
        return TextIn(stream=stream, text=text)
    if cls is Start:
        voice = obj.get("voice")
        if voice is not None and not isinstance(voice, str):
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "'voice' must be a string", stream=stream)
        fmt = obj.get("format", "pcm_s16le")
        if fmt not in FORMATS:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_FORMAT,
                f"'format' must be one of {list(FORMATS)}, got {fmt!r}",
                stream=stream,
            )
        options = obj.get("options") or {}
        if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
            raise ProtocolError(
                ErrorCode.BAD_MESSAGE, "'options' must be a map with string keys", stream=stream
            )
        for name, value in options.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ProtocolError(
                    ErrorCode.INVALID_OPTION, f"option {name!r} must be finite", stream=stream
                )
        return Start(stream=stream, voice=voice, format=fmt, options=options)
    return cls(stream=stream)


def encode_client_message(msg: dict[str, Any], encoding: Encoding = Encoding.MSGPACK) -> bytes | str:
    """For clients (our Python client, tests): encode a client -> server map."""
    if encoding is Encoding.JSON:
        return json.dumps(msg)
    return msgpack.packb(msg, use_bin_type=True)


# --- server -> client ------------------------------------------------------------------------


def hello(*, model: str, voices: list[str], sample_rate: int, default_voice: str,
          options: dict[str, Any], limits: dict[str, Any], device: str = "",
          supports_cloning: bool = False) -> dict[str, Any]:
    return {
        "type": "hello",
        "protocol": PROTOCOL_VERSION,
        "model": model,
        "voices": voices,
        "default_voice": default_voice,
        "sample_rate": sample_rate,
        "formats": list(FORMATS),
        "options": options,
        "limits": limits,
        "device": device,
        "supports_cloning": supports_cloning,
    }


def ready(stream: str, *, sample_rate: int, fmt: str, voice: str,
          options: dict[str, Any]) -> dict[str, Any]:
    return {"type": "ready", "stream": stream, "sample_rate": sample_rate, "format": fmt,
            "voice": voice, "options": options}


def audio(stream: str, *, seq: int, offset: int, pcm: bytes,
          span: tuple[int, int] | None = None, text: str | None = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"type": "audio", "stream": stream, "seq": seq, "offset": offset,
                           "pcm": pcm}
    if span is not None:
        msg["span"] = list(span)
    if text is not None:
        msg["text"] = text
    return msg


def done(stream: str, *, reason: str, samples: int, **timings: float) -> dict[str, Any]:
    return {"type": "done", "stream": stream, "reason": reason, "samples": samples, **timings}


def error(code: ErrorCode | str, message: str, *, stream: str | None = None,
          retryable: bool = False) -> dict[str, Any]:
    return {"type": "error", "stream": stream, "code": str(getattr(code, "value", code)),
            "message": message, "retryable": retryable}


# One Packer for every server frame: ``msgpack.packb`` builds a new one per call, which costs
# more than packing an audio map (this runs once per chunk). ``pack`` holds the GIL throughout
# and resets after each call, so sharing it is safe.
_PACKER = msgpack.Packer(use_bin_type=True)


def encode_server_message(msg: dict[str, Any], encoding: Encoding) -> bytes | str:
    if encoding is Encoding.JSON:
        if isinstance(msg.get("pcm"), (bytes, bytearray, memoryview)):
            msg = {**msg, "pcm": base64.b64encode(msg["pcm"]).decode("ascii")}
        return json.dumps(msg)
    return _PACKER.pack(msg)


def decode_server_frame(frame: bytes | str) -> dict[str, Any]:
    """For clients: decode a server frame (msgpack or JSON) into a map; PCM as bytes."""
    if isinstance(frame, str):
        msg = json.loads(frame)
        if msg.get("type") == "audio" and isinstance(msg.get("pcm"), str):
            msg["pcm"] = base64.b64decode(msg["pcm"])
        return msg
    return msgpack.unpackb(frame, raw=False, strict_map_key=False)
