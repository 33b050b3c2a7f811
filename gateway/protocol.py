"""The client <-> gateway wire protocol (v1): the only module that builds or parses its frames.
See docs/protocol.md for the whole protocol with examples.
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
    "OUTPUT_SAMPLE_RATES",
    "output_sample_rates",
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
    "check_declared_options",
    "check_sample_rate",
    "show_value",
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
# The rates (Hz) a start's ``sample_rate`` may ask for, besides the model's own; the gateway
# resamples (gateway.resample). A documented set, not any rate, so clients can rely on it.
OUTPUT_SAMPLE_RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
MAX_STREAM_ID_CHARS = 128
MAX_OPTIONS = 64  # entries in a start's ``options``
# Integers the engine's encoding (msgpack) can carry: int64 and uint64.
_INT_RANGE = (-(2**63), 2**64 - 1)


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
    ENGINE_FAILED = "engine_failed"  # the engine kept dying; the server exits
    MODEL_ERROR = "model_error"
    INTERNAL = "internal"


class ProtocolError(Exception):
    """A client frame that cannot be accepted. Becomes an ``error`` message for the client."""

    def __init__(
        self, code: ErrorCode, message: str, *, stream: str | None = None, retryable: bool = False,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.stream = stream
        self.retryable = retryable
        self.retry_after_s = retry_after_s  # a `capacity` refusal's hint


# --- client -> server ------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientMessage:
    stream: str


@dataclass(frozen=True)
class Start(ClientMessage):
    voice: str | None = None
    format: str = "pcm_s16le"
    options: dict[str, Any] = field(default_factory=dict)
    sample_rate: int | None = None  # Hz; None: the model's rate (no resampling)


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
        except RecursionError:  # the C decoder's depth guard
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "text frame is nested too deeply") from None
        except ValueError as exc:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"text frame is not JSON: {exc}") from None
    try:
        # surrogateescape: bytes that are not UTF-8 become lone surrogates, which the field
        # checks below reject naming the field (instead of failing the whole frame here).
        return msgpack.unpackb(frame, raw=False, strict_map_key=False,
                               unicode_errors="surrogateescape")
    except msgpack.StackError:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "binary frame is nested too deeply") from None
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"binary frame is not msgpack: {exc}") from None


def show_value(value: Any) -> str:
    """A short, always-encodable rendering of a client value for an error message."""
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:40] + "...")  # repr escapes surrogates
    if value is None or isinstance(value, (bool, float)):
        return repr(value)
    if isinstance(value, int):
        return repr(value) if -(10**30) < value < 10**30 else "a huge integer"
    return f"a value of type {type(value).__name__}"


def _is_text(value: str) -> bool:
    """True if ``value`` encodes as UTF-8: no lone surrogates (from JSON ``\\ud800`` escapes or
    from msgpack bytes that are not UTF-8)."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _not_text(name: str, stream: str | None) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_MESSAGE,
                         f"'{name}' is not valid text: it holds a lone surrogate or bytes that "
                         "are not UTF-8", stream=stream)


def parse_client_frame(frame: bytes | str) -> ClientMessage:
    """Decode and validate one client frame. Raises ``ProtocolError`` (never anything else for
    any input): what it returns holds only strings that encode as UTF-8 and options the engine's
    encoding can carry."""
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
            f"unknown type {show_value(kind)}; expected one of {sorted(_CLIENT_TYPES)}",
        )
    stream = obj.get("stream")
    if isinstance(stream, int) and not isinstance(stream, bool) and -(10**40) < stream < 10**40:
        stream = str(stream)
    if not isinstance(stream, str) or not stream or len(stream) > MAX_STREAM_ID_CHARS:
        raise ProtocolError(
            ErrorCode.BAD_MESSAGE,
            f"'stream' must be a non-empty string of at most {MAX_STREAM_ID_CHARS} characters",
        )
    if not _is_text(stream):
        raise _not_text("stream", None)
    if cls is TextIn:
        text = obj.get("text")
        if not isinstance(text, str):
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "'text' must be a string", stream=stream)
        if not _is_text(text):
            raise _not_text("text", stream)
        return TextIn(stream=stream, text=text)
    if cls is Start:
        return _parse_start(obj, stream)
    return cls(stream=stream)


def _parse_start(obj: dict[Any, Any], stream: str) -> Start:
    voice = obj.get("voice")
    if voice is not None and not isinstance(voice, str):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "'voice' must be a string", stream=stream)
    if voice is not None and not _is_text(voice):
        raise _not_text("voice", stream)
    fmt = obj.get("format", "pcm_s16le")
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_FORMAT,
            f"'format' must be one of {list(FORMATS)}, got {show_value(fmt)}",
            stream=stream,
        )
    sample_rate = obj.get("sample_rate")
    if sample_rate is not None and (not isinstance(sample_rate, int)
                                    or isinstance(sample_rate, bool)):
        raise _bad_sample_rate(sample_rate, OUTPUT_SAMPLE_RATES, stream)
    options = obj.get("options") or {}
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise ProtocolError(
            ErrorCode.BAD_MESSAGE, "'options' must be a map with string keys", stream=stream
        )
    if len(options) > MAX_OPTIONS:
        raise ProtocolError(ErrorCode.INVALID_OPTION,
                            f"at most {MAX_OPTIONS} options, got {len(options)}", stream=stream)
    for name, value in options.items():
        if not _is_text(name):
            raise _not_text("options", stream)
        _check_option_value(name, value, stream)
    return Start(stream=stream, voice=voice, format=fmt, options=options,
                 sample_rate=sample_rate)


def _check_option_value(name: str, value: Any, stream: str) -> None:
    """An option is a scalar the engine's encoding carries: null, a boolean, a finite number
    in int64/uint64 range, or text."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            raise ProtocolError(ErrorCode.INVALID_OPTION,
                                f"option {show_value(name)} is out of range: integers must be in "
                                "[-2^63, 2^64 - 1]", stream=stream)
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ProtocolError(ErrorCode.INVALID_OPTION, f"option {show_value(name)} must be finite",
                                stream=stream)
        return
    if isinstance(value, str):
        if not _is_text(value):
            raise _not_text(f"options.{name}" if name.isascii() else "options", stream)
        return
    raise ProtocolError(ErrorCode.INVALID_OPTION,
                        f"option {show_value(name)} must be a number, a string, a boolean or null, "
                        f"got {show_value(value)}", stream=stream)


def check_declared_options(options: dict[str, Any], declared: dict[str, Any], *,
                           stream: str) -> None:
    """Check numeric options against the ranges the backend declared in ``hello`` (``min``,
    ``max``, ``min_inclusive``); raises ``ProtocolError(INVALID_OPTION)``. Options it did not
    declare, and declared ones without a range, are left to the engine to judge."""
    for name, value in options.items():
        spec = declared.get(name)
        if not isinstance(spec, dict) or not _is_number(value):
            continue
        low, high = spec.get("min"), spec.get("max")
        low_inclusive = spec.get("min_inclusive", True) is not False
        too_low = _is_number(low) and (value < low if low_inclusive else value <= low)
        too_high = _is_number(high) and value > high
        if too_low or too_high:
            bounds = f"{'[' if low_inclusive else '('}{_bound(low, '-inf')}, {_bound(high, 'inf')}]"
            raise ProtocolError(ErrorCode.INVALID_OPTION,
                                f"{name} must be in {bounds}, got {show_value(value)}", stream=stream)


def output_sample_rates(model_rate: int) -> list[int]:
    """The rates a stream may ask for (``hello.output_sample_rates``): the documented set and the
    model's own rate."""
    return sorted({*OUTPUT_SAMPLE_RATES, model_rate})


def check_sample_rate(sample_rate: int | None, model_rate: int, *, stream: str) -> int:
    """The rate a stream's audio is delivered at: ``sample_rate`` if it is one of
    ``output_sample_rates(model_rate)``, the model's rate if it is ``None``; raises
    ``ProtocolError(UNSUPPORTED_FORMAT)`` naming the rates otherwise."""
    if sample_rate is None:
        return model_rate
    allowed = output_sample_rates(model_rate)
    if sample_rate not in allowed:
        raise _bad_sample_rate(sample_rate, allowed, stream)
    return sample_rate


def _bad_sample_rate(value: Any, allowed: Any, stream: str) -> ProtocolError:
    return ProtocolError(ErrorCode.UNSUPPORTED_FORMAT,
                         f"'sample_rate' must be an integer number of Hz, one of {list(allowed)}, "
                         f"got {show_value(value)}", stream=stream)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bound(value: Any, unbounded: str) -> str:
    if not _is_number(value):
        return unbounded
    return f"{value:g}" if isinstance(value, float) else str(value)


def encode_client_message(msg: dict[str, Any], encoding: Encoding = Encoding.MSGPACK) -> bytes | str:
    """For clients (our Python client, tests): encode a client -> server map."""
    if encoding is Encoding.JSON:
        return json.dumps(msg)
    return msgpack.packb(msg, use_bin_type=True)


# --- server -> client ------------------------------------------------------------------------


def hello(*, model: str, voices: list[str], sample_rate: int, default_voice: str,
          options: dict[str, Any], limits: dict[str, Any], device: str = "",
          weights: str = "loaded", supports_cloning: bool = False) -> dict[str, Any]:
    return {
        "type": "hello",
        "protocol": PROTOCOL_VERSION,
        "model": model,
        "voices": voices,
        "default_voice": default_voice,
        "sample_rate": sample_rate,
        "output_sample_rates": output_sample_rates(sample_rate),
        "formats": list(FORMATS),
        "options": options,
        "limits": limits,
        "device": device,
        "weights": weights,
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
          retryable: bool = False, retry_after_s: float | None = None) -> dict[str, Any]:
    msg = {"type": "error", "stream": stream, "code": str(getattr(code, "value", code)),
           "message": message, "retryable": retryable}
    if retry_after_s is not None:  # a `capacity` refusal: when a retry may find room
        msg["retry_after_s"] = retry_after_s
    return msg


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
