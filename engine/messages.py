"""Every message between the gateway and the engine process and their bytes: the only module that
builds or parses them (frozen dataclasses as msgpack arrays ``[kind, ...]``, a step's messages
in one ``Batch``; docs/architecture.md). Streams are named by an engine-wide int ``key``.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack

__all__ = [
    "Kind",
    "Message",
    "VoiceRef",
    "Open",
    "Text",
    "Flush",
    "End",
    "Cancel",
    "Shutdown",
    "Hello",
    "Started",
    "Audio",
    "Done",
    "Error",
    "Stats",
    "Batch",
    "Heartbeat",
    "Flushed",
    "encode",
    "decode",
    "DecodeError",
]


class Kind(enum.IntEnum):
    # gateway -> engine
    OPEN = 1
    TEXT = 2
    FLUSH = 3
    END = 4
    CANCEL = 5
    SHUTDOWN = 6
    # engine -> gateway
    HELLO = 20
    STARTED = 21
    AUDIO = 22
    DONE = 23
    ERROR = 24
    STATS = 25
    BATCH = 26
    HEARTBEAT = 27
    FLUSHED = 28


class DecodeError(ValueError):
    """Bytes that are not a valid engine message."""


@dataclass(frozen=True)
class Message:
    KIND: ClassVar[Kind]


# --- gateway -> engine -------------------------------------------------------------------


@dataclass(frozen=True)
class VoiceRef:
    """A registered (cloned) voice, as the gateway's voice store keeps it: a mono WAV file on
    the machine both processes share, its rate, its sha256 (a backend may key a cached
    encoding of the voice on it), and the words spoken in it where the user gave them.

    Not a message of its own: it travels inside ``Open``, on the wire as
    ``[voice_id, path, sample_rate, sha256, transcript]``.
    """

    voice_id: str
    path: str
    sample_rate: int
    sha256: str
    transcript: str | None = None


@dataclass(frozen=True)
class Open(Message):
    """Start a stream. The engine answers ``Started`` or ``Error``.

    ``voice_ref`` names a registered voice: the engine asks the backend to prepare it
    (``prepare_voice``) and uses the voice name that returns; ``voice`` is then ignored.
    """

    KIND: ClassVar[Kind] = Kind.OPEN
    key: int
    voice: str | None
    options: dict[str, Any] = field(default_factory=dict)
    format: str = "pcm_f32le"  # the PCM format of this stream's Audio: pcm_f32le | pcm_s16le
    voice_ref: VoiceRef | None = None


@dataclass(frozen=True)
class Text(Message):
    KIND: ClassVar[Kind] = Kind.TEXT
    key: int
    text: str


@dataclass(frozen=True)
class Flush(Message):
    KIND: ClassVar[Kind] = Kind.FLUSH
    key: int


@dataclass(frozen=True)
class End(Message):
    KIND: ClassVar[Kind] = Kind.END
    key: int


@dataclass(frozen=True)
class Cancel(Message):
    KIND: ClassVar[Kind] = Kind.CANCEL
    key: int


@dataclass(frozen=True)
class Shutdown(Message):
    KIND: ClassVar[Kind] = Kind.SHUTDOWN


# --- engine -> gateway -------------------------------------------------------------------


@dataclass(frozen=True)
class Hello(Message):
    """The engine's start-up handshake: the model is loaded and warm."""

    KIND: ClassVar[Kind] = Kind.HELLO
    model: str
    voices: list[str]
    default_voice: str
    sample_rate: int
    options: dict[str, Any] = field(default_factory=dict)
    device: str = ""  # what the engine computes on (engine.device_info)
    weights: str = "loaded"  # or "random" (--load-format dummy)
    supports_cloning: bool = False  # the backend takes registered voices (``VoiceRef``)
    # the backend takes text while it speaks: its ``Flushed`` comes when the flush reached it,
    # before that flush's audio (``Flushed``)
    input_streaming: bool = False


@dataclass(frozen=True)
class Started(Message):
    KIND: ClassVar[Kind] = Kind.STARTED
    key: int
    voice: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Audio(Message):
    """A chunk of mono little-endian PCM in the format the stream was opened with.

    ``span`` is the [start, end) character range of the stream's text this segment speaks;
    ``t_emit`` is ``time.monotonic()`` in the engine when the chunk left it (CLOCK_MONOTONIC is
    system-wide on Linux, so the gateway can measure the hop).
    """

    KIND: ClassVar[Kind] = Kind.AUDIO
    key: int
    pcm: bytes
    span: tuple[int, int] | None = None
    t_emit: float = 0.0


@dataclass(frozen=True)
class Done(Message):
    KIND: ClassVar[Kind] = Kind.DONE
    key: int
    reason: str  # "end" | "cancelled"
    samples: int
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Error(Message):
    """A failure of one stream (``key``) or of the engine as a whole (``key is None``)."""

    KIND: ClassVar[Kind] = Kind.ERROR
    key: int | None
    code: str
    message: str
    retryable: bool
    retry_after_s: float | None = None  # a `capacity` refusal: when a retry may find room


@dataclass(frozen=True)
class Stats(Message):
    KIND: ClassVar[Kind] = Kind.STATS
    num_streams: int
    num_queued_jobs: int
    num_running_jobs: int
    # Counters since the engine started, by name (``EngineLoop``: steps, busy_s; a backend's
    # own, e.g. the LM backend's decode_rows): the gateway exports them as metrics.
    totals: dict[str, float] = field(default_factory=dict)
    # Admission figures (``engine.admission.Admission.snapshot``): capacity, demand, queue...
    admission: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Batch(Message):
    """Several engine -> gateway messages, in order, in one queue record (never nested).

    On the wire: ``[26, [[kind, field1, ...], [kind, ...], ...]]``.
    """

    KIND: ClassVar[Kind] = Kind.BATCH
    messages: list[Message]


@dataclass(frozen=True)
class Heartbeat(Message):
    """Sent by the engine process at a fixed interval from a thread of its own, also while a
    step runs: the gateway's watchdog (``gateway.engine_client``) takes silence with streams
    open for a hung engine. ``step_s``: how long the step in progress has run (0.0 between
    steps); ``num_steps``: steps taken since the engine started."""

    KIND: ClassVar[Kind] = Kind.HEARTBEAT
    step_s: float
    num_steps: int


@dataclass(frozen=True)
class Flushed(Message):
    """The audio of all the text a stream had before its ``num_flushes``-th ``Flush`` has been
    sent (every ``Audio`` of it precedes this message). With a backend that takes text as it
    arrives (``input_streaming``) it is sent once the flush has reached the backend instead."""

    KIND: ClassVar[Kind] = Kind.FLUSHED
    key: int
    num_flushes: int


_BY_KIND: dict[int, type[Message]] = {
    cls.KIND: cls
    for cls in (Open, Text, Flush, End, Cancel, Shutdown, Hello, Started, Audio, Done, Error, Stats,
                Heartbeat, Flushed)
}
_FIELDS: dict[type[Message], tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in _BY_KIND.values()
}


_VOICE_REF_FIELDS = tuple(f.name for f in dataclasses.fields(VoiceRef))


def _items(msg: Message) -> list[Any]:
    cls = type(msg)
    if cls is Batch:
        raise ValueError("a Batch cannot hold a Batch")
    items = [int(cls.KIND), *(getattr(msg, name) for name in _FIELDS[cls])]
    if cls is Open and items[5] is not None:
        items[5] = [getattr(items[5], name) for name in _VOICE_REF_FIELDS]
    return items


def _voice_ref(items: Any) -> VoiceRef:
    if not isinstance(items, list) or len(items) != len(_VOICE_REF_FIELDS):
        raise DecodeError(f"Open.voice_ref: expected {len(_VOICE_REF_FIELDS)} fields")
    voice_id, path, sample_rate, sha256, transcript = items
    if not (isinstance(voice_id, str) and isinstance(path, str) and isinstance(sha256, str)
            and isinstance(sample_rate, int) and (transcript is None or isinstance(transcript, str))):
        raise DecodeError("Open.voice_ref: a field has the wrong type")
    return VoiceRef(voice_id, path, sample_rate, sha256, transcript)


# ``msgpack.packb`` builds a new Packer per call; one shared Packer costs less. ``pack`` holds
# the GIL throughout and resets after each call, so sharing it is safe.
_PACKER = msgpack.Packer(use_bin_type=True)


def encode(msg: Message) -> bytes:
    if type(msg) is Batch:
        items = [_items(x) for x in msg.messages]  # type: ignore[attr-defined]
        return _PACKER.pack([int(Kind.BATCH), items])
    return _PACKER.pack(_items(msg))


def decode(data: bytes | memoryview) -> Message:
    try:
        items = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise DecodeError(f"not msgpack: {exc}") from None
    if isinstance(items, list) and len(items) == 2 and items[0] == Kind.BATCH:
        if not isinstance(items[1], list):
            raise DecodeError("Batch: expected a list of messages")
        return Batch([_from_items(x) for x in items[1]])
    return _from_items(items)


def _from_items(items: Any) -> Message:
    if not isinstance(items, list) or not items or not isinstance(items[0], int):
        raise DecodeError("expected [kind, ...]")
    cls = _BY_KIND.get(items[0])
    if cls is None:  # Batch is not in _BY_KIND: a nested Batch is an unknown kind here
        raise DecodeError(f"unknown message kind {items[0]}")
    names = _FIELDS[cls]
    if len(items) - 1 != len(names):
        raise DecodeError(f"{cls.__name__}: expected {len(names)} fields, got {len(items) - 1}")
    if cls is Audio and items[3] is not None:
        items[3] = tuple(items[3])  # span
    elif cls is Open and items[5] is not None:
        items[5] = _voice_ref(items[5])
    try:
        return cls(*items[1:])
    except TypeError as exc:
        raise DecodeError(f"{cls.__name__}: {exc}") from None
