"""One client connection's protocol state machine. No I/O: frames and engine messages in, actions
out (``ToClient``, ``ToEngine``, ``Close``); no input makes a method raise (docs/architecture.md,
"Gateway").
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Protocol, Union

from engine import messages as em
from gateway import protocol as p
from gateway.admission_door import AdmissionDoor
from gateway.protocol import ErrorCode, ProtocolError
from gateway.resample import ENGINE_FORMAT, PcmResampler

__all__ = ["ToClient", "ToEngine", "Close", "Action", "SessionMetrics", "Session"]

log = logging.getLogger("voxgate.gateway")


@dataclass(frozen=True)
class ToClient:
    msg: dict[str, Any]


@dataclass(frozen=True)
class ToEngine:
    msg: em.Message


@dataclass(frozen=True)
class Close:
    code: int
    reason: str


Action = Union[ToClient, ToEngine, Close]


class SessionMetrics(Protocol):
    def observe_ttfa(self, seconds: float) -> None: ...
    def observe_chunk_gap(self, seconds: float) -> None: ...
    def count_error(self, code: str) -> None: ...
    def count_stream(self, outcome: str) -> None: ...
    def count_samples_sent(self, num_samples: int) -> None: ...


class _NoMetrics:
    def observe_ttfa(self, seconds: float) -> None:
        pass

    def observe_chunk_gap(self, seconds: float) -> None:
        pass

    def count_error(self, code: str) -> None:
        pass

    def count_stream(self, outcome: str) -> None:
        pass

    def count_samples_sent(self, num_samples: int) -> None:
        pass


@dataclass
class _Stream:
    id: str
    key: int
    fmt: str
    rate: int  # Hz, of the audio the client gets
    # Set when ``rate`` is not the model's: the engine's f32 audio is resampled into ``fmt``.
    resampler: PcmResampler | None = None
    text: str = ""
    is_ended: bool = False
    seq: int = 0
    samples: int = 0  # sent to the client, at ``rate``
    engine_samples: int = 0  # received from the engine (resampled streams only)
    last_span: tuple[int, int] | None = None
    held_span: tuple[int, int] | None = None  # of audio the resampler holds, not yet sent
    last_t_emit: float = 0.0
    t_start: float = 0.0
    t_first_text: float | None = None
    t_first_audio: float | None = None
    t_last_audio: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_SAMPLE_BYTES = {"pcm_s16le": 2, "pcm_f32le": 4}


class Session:
    """The protocol state of one connection: its streams and their engine keys."""

    def __init__(
        self,
        *,
        hello: em.Hello,
        limits: dict[str, Any],
        allocate_key: Callable[[], int],
        is_engine_ready: Callable[[], bool],
        metrics: SessionMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        debug_timestamps: bool = False,
        resolve_voice: Callable[[str], em.VoiceRef | None] | None = None,
        report_flushes: bool = False,
        door: AdmissionDoor | None = None,
    ) -> None:
        """``resolve_voice`` finds a registered voice that ``start`` names (not a built-in one):
        a ``VoiceRef``, ``None`` if there is none, or ``LookupError`` naming the ambiguity.
        ``report_flushes``: the engine's flush acknowledgements reach the client as
        ``{"type": "flushed", "stream", "flush"}`` maps (the compatibility adapters use them;
        the native protocol does not send them)."""
        self._hello = hello
        self._limits = dict(limits)
        self._max_streams = int(limits["max_streams_per_connection"])
        self._max_text = int(limits["max_text_chars_per_stream"])
        self._allocate_key = allocate_key
        self._is_engine_ready = is_engine_ready
        self._metrics = metrics or _NoMetrics()
        self._clock = clock
        self._debug_timestamps = debug_timestamps
        self._resolve_voice = resolve_voice
        self.report_flushes = report_flushes
        self._door = door  # refusals at the gateway and the retry hints (gateway.admission_door)
        self._shutdown_reason: str | None = None  # set: starts are refused (server_shutdown)
        self._streams: dict[str, _Stream] = {}
        self._by_key: dict[int, _Stream] = {}
        self._is_closed = False  # closing for a reason of its own: later frames are ignored

    # --- connection ------------------------------------------------------------------------

    def greeting(self) -> dict[str, Any]:
        h = self._hello
        return p.hello(model=h.model, voices=list(h.voices), sample_rate=h.sample_rate,
                       default_voice=h.default_voice, options=h.options, limits=self._limits,
                       device=h.device, weights=h.weights, supports_cloning=h.supports_cloning)

    @property
    def num_active_streams(self) -> int:
        return len(self._streams)

    def keys(self) -> list[int]:
        return list(self._by_key)

    def close(self) -> list[Action]:
        """The connection is gone: cancel every stream in the engine."""
        self._is_closed = True
        actions: list[Action] = [ToEngine(em.Cancel(s.key)) for s in self._streams.values()]
        for stream in list(self._streams.values()):
            self._forget(stream)
            self._metrics.count_stream("disconnected")
        return actions

    def on_slow_consumer(self) -> list[Action]:
        """The client stopped reading: its unsent audio passed ``--max-outbox-bytes``.

        Every stream of the connection is cancelled in the engine now, a ``slow_consumer``
        error (connection-level, retryable: reconnect) is sent, and the connection closes with
        1008. Call after dropping the connection's unsent frames, so that the error can go out;
        the adapter should still cut a client that never reads its close frame off after a grace
        period. Frames received afterwards are ignored. Idempotent."""
        if self._is_closed:
            return []
        self._is_closed = True
        actions: list[Action] = []
        for stream in list(self._streams.values()):
            self._forget(stream)
            self._metrics.count_stream("slow_consumer")
            actions.append(ToEngine(em.Cancel(stream.key)))
        self._metrics.count_error(ErrorCode.SLOW_CONSUMER.value)
        actions.append(ToClient(p.error(
            ErrorCode.SLOW_CONSUMER,
            "the client is not reading its audio: its buffered audio passed the limit; its "
            "streams are cancelled and the connection closes", retryable=True)))
        actions.append(Close(1008, "slow consumer: the client is not reading its audio"))
        return actions

    def stop_accepting(self, reason: str) -> None:
        """The server is draining: later starts get a retryable ``server_shutdown``."""
        self._shutdown_reason = reason

    def shutdown(self, reason: str) -> list[Action]:
        """The server stops now: every stream ends with a retryable ``server_shutdown`` and is
        cancelled in the engine."""
        self.stop_accepting(reason)
        actions: list[Action] = []
        for stream in list(self._streams.values()):
            self._forget(stream)
            self._metrics.count_error(ErrorCode.SERVER_SHUTDOWN.value)
            self._metrics.count_stream("error")
            actions.append(ToEngine(em.Cancel(stream.key)))
            actions.append(ToClient(p.error(ErrorCode.SERVER_SHUTDOWN, reason, stream=stream.id,
                                            retryable=True)))
        return actions

    # --- client frames ---------------------------------------------------------------------

    def receive_frame(self, frame: bytes | str) -> list[Action]:
        """Actions for one client frame; never raises (a bad frame gets an ``error``)."""
        if self._is_closed:
            return []
        try:
            return self._dispatch(p.parse_client_frame(frame))
        except ProtocolError as exc:
            return self._refused(exc)
        except Exception:  # a bug of ours: this frame fails, the connection goes on
            log.exception("a client frame could not be handled")
            self._metrics.count_error(ErrorCode.INTERNAL.value)
            return [ToClient(p.error(ErrorCode.INTERNAL, "the server could not handle this frame"))]

    def receive_message(self, msg: p.ClientMessage) -> list[Action]:
        """``receive_frame`` for a message already parsed (by a compatibility adapter, which
        builds it from another protocol's frame); never raises."""
        if self._is_closed:
            return []
        try:
            return self._dispatch(msg)
        except ProtocolError as exc:
            return self._refused(exc)
        except Exception:  # a bug of ours: this message fails, the connection goes on
            log.exception("a client message could not be handled")
            self._metrics.count_error(ErrorCode.INTERNAL.value)
            return [ToClient(p.error(ErrorCode.INTERNAL, "the server could not handle this frame"))]

    def _refused(self, exc: ProtocolError) -> list[Action]:
        self._metrics.count_error(exc.code.value)
        return [ToClient(p.error(exc.code, exc.message, stream=exc.stream,
                                 retryable=exc.retryable, retry_after_s=exc.retry_after_s))]

    def _dispatch(self, msg: p.ClientMessage) -> list[Action]:
        if isinstance(msg, p.Start):
            return self._start(msg)
        stream = self._streams.get(msg.stream)
        if stream is None:
            raise ProtocolError(ErrorCode.UNKNOWN_STREAM,
                                f"stream {msg.stream!r} is not active; send 'start' first",
                                stream=msg.stream)
        if isinstance(msg, p.Cancel):
            return self._cancel(stream)
        if stream.is_ended:
            raise ProtocolError(ErrorCode.STREAM_ENDED,
                                f"stream {msg.stream!r} has ended; no more text is accepted",
                                stream=msg.stream)
        if isinstance(msg, p.TextIn):
            return self._text(stream, msg.text)
        if isinstance(msg, p.Flush):
            return [ToEngine(em.Flush(stream.key))]
        stream.is_ended = True
        return [ToEngine(em.End(stream.key))]

    def _start(self, msg: p.Start) -> list[Action]:
        if self._shutdown_reason is not None:
            raise ProtocolError(ErrorCode.SERVER_SHUTDOWN, self._shutdown_reason,
                                stream=msg.stream, retryable=True)
        if msg.stream in self._streams:
            raise ProtocolError(ErrorCode.STREAM_EXISTS,
                                f"stream {msg.stream!r} is already active", stream=msg.stream)
        if len(self._streams) >= self._max_streams:
            raise ProtocolError(ErrorCode.TOO_MANY_STREAMS,
                                f"at most {self._max_streams} active streams per connection",
                                stream=msg.stream, retryable=True)
        voice_ref = None
        if msg.voice is not None and msg.voice not in self._hello.voices:
            voice_ref = self._registered_voice(msg.voice, msg.stream)
        p.check_declared_options(msg.options, self._hello.options, stream=msg.stream)
        model_rate = self._hello.sample_rate
        rate = p.check_sample_rate(msg.sample_rate, model_rate, stream=msg.stream)
        if not self._is_engine_ready():
            raise ProtocolError(ErrorCode.ENGINE_UNAVAILABLE,
                                "the engine is starting or restarting; try again shortly",
                                stream=msg.stream, retryable=True)
        if self._door is not None:
            retry_after_s = self._door.check()
            if retry_after_s is not None:
                raise ProtocolError(
                    ErrorCode.CAPACITY, f"server at capacity: no engine has room for another "
                    f"stream now; retry after {retry_after_s:.1f} s", stream=msg.stream,
                    retryable=True, retry_after_s=retry_after_s)
        resampler = (PcmResampler(input_rate=model_rate, output_rate=rate, fmt=msg.format)
                     if rate != model_rate else None)
        stream = _Stream(msg.stream, self._allocate_key(), msg.format, rate, resampler,
                         t_start=self._clock())
        self._streams[stream.id] = stream
        self._by_key[stream.key] = stream
        engine_fmt = msg.format if resampler is None else ENGINE_FORMAT
        return [ToEngine(em.Open(stream.key, msg.voice, dict(msg.options), engine_fmt, voice_ref))]

    def _registered_voice(self, voice: str, stream: str) -> em.VoiceRef:
        try:
            ref = self._resolve_voice(voice) if self._resolve_voice is not None else None
        except LookupError as exc:
            raise ProtocolError(ErrorCode.UNKNOWN_VOICE, str(exc.args[0]), stream=stream) from None
        if ref is None:
            registered = " or a registered voice's id (GET /v1/voices)" if self._resolve_voice else ""
            raise ProtocolError(ErrorCode.UNKNOWN_VOICE,
                                f"unknown voice {p.show_value(voice)}; voices: {list(self._hello.voices)}"
                                + registered, stream=stream)
        return ref

    def _text(self, stream: _Stream, text: str) -> list[Action]:
        if len(stream.text) + len(text) > self._max_text:
            self._forget(stream)
            self._metrics.count_error(ErrorCode.TEXT_TOO_LONG.value)
            self._metrics.count_stream("error")
            return [
                ToEngine(em.Cancel(stream.key)),
                ToClient(p.error(ErrorCode.TEXT_TOO_LONG,
                                 f"a stream takes at most {self._max_text} characters of text; "
                                 "the stream has ended", stream=stream.id)),
            ]
        if stream.t_first_text is None and text.strip():
            stream.t_first_text = self._clock()
        stream.text += text
        return [ToEngine(em.Text(stream.key, text))] if text else []

    def _cancel(self, stream: _Stream) -> list[Action]:
        self._forget(stream)
        self._metrics.count_stream("cancelled")
        return [ToEngine(em.Cancel(stream.key)),
                ToClient(self._done_msg(stream, "cancelled"))]

    # --- engine messages -------------------------------------------------------------------

    def on_engine(self, msg: em.Message) -> list[Action]:
        stream = self._by_key.get(getattr(msg, "key", -1))
        if stream is None:
            return []  # cancelled or failed already: late output is dropped here
        if type(msg) is em.Audio:
            frame = self._audio_msg(stream, msg)
            return [] if frame is None else [ToClient(frame)]
        if isinstance(msg, em.Flushed):
            # the flush's audio is all out of the engine: what the resampler holds goes too
            # (not where the engine takes text while it speaks: its Flushed comes before the
            # audio, which goes on through the resampler, and its tail goes at the end)
            actions = [] if self._hello.input_streaming else self._resampler_tail(stream)
            if self.report_flushes:
                actions.append(ToClient({"type": "flushed", "stream": stream.id,
                                         "flush": msg.num_flushes}))
            return actions
        if isinstance(msg, em.Started):
            return [ToClient(p.ready(stream.id, sample_rate=stream.rate,
                                     fmt=stream.fmt, voice=msg.voice, options=msg.options))]
        if isinstance(msg, em.Done):
            actions = self._resampler_tail(stream) if msg.reason == "end" else []
            self._forget(stream)
            if self._door is not None:
                self._door.stream_left()
            self._metrics.count_stream(msg.reason)
            done = self._done_msg(stream, msg.reason)
            if "queue_wait_ms" in msg.timings:  # it waited for admission
                done["queue_wait_ms"] = round(msg.timings["queue_wait_ms"], 3)
            return actions + [ToClient(done)]
        if isinstance(msg, em.Error):
            self._forget(stream)
            self._metrics.count_error(msg.code)
            self._metrics.count_stream("error")
            retry_after_s, message = msg.retry_after_s, msg.message
            if msg.code == ErrorCode.CAPACITY.value and self._door is not None:
                retry_after_s = self._door.refused(msg.retry_after_s)
                if retry_after_s != msg.retry_after_s:  # the crowd of retrying clients is large
                    message = f"{message.rsplit('; retry after', 1)[0]}; retry after {retry_after_s:.1f} s"
            elif self._door is not None:  # a stream that fails frees its place like one that ends
                self._door.stream_left()
            return [ToClient(p.error(msg.code, message, stream=stream.id,
                                     retryable=msg.retryable, retry_after_s=retry_after_s))]
        return []

    def on_audio(self, msg: em.Audio) -> dict[str, Any] | None:
        """The hot path of ``on_engine`` for audio: the ``audio`` map to send, or ``None`` if
        there is none (the stream is gone, or its resampler holds the whole chunk): the same as
        ``on_engine`` returning ``[ToClient(map)]`` or ``[]``."""
        stream = self._by_key.get(msg.key)
        return None if stream is None else self._audio_msg(stream, msg)

    def on_engine_lost(self, *, is_final: bool = False,
                       keys: Collection[int] | None = None) -> list[Action]:
        """The engine died: every stream of this connection fails with a retryable
        ``engine_restarted`` error, as it is being restarted. ``keys``: only the streams with
        these engine keys fail (with several engines, those of the engine that died).

        ``is_final``: it died too often (``--max-engine-restarts``) and the server is exiting:
        the streams fail with a non-retryable ``engine_failed``, the connection gets one too
        (``stream`` null) and closes with 1011; later frames are ignored."""
        if is_final and self._is_closed:
            return []
        code = ErrorCode.ENGINE_FAILED if is_final else ErrorCode.ENGINE_RESTARTED
        message = ("the engine failed repeatedly and the server is exiting; this stream's audio "
                   "is lost" if is_final else
                   "the engine stopped unexpectedly and is restarting; this stream's audio is lost")
        actions: list[Action] = []
        streams = list(self._streams.values()) if keys is None else [
            self._by_key[k] for k in keys if k in self._by_key]
        for stream in streams:
            self._forget(stream)
            self._metrics.count_error(code.value)
            self._metrics.count_stream("error")
            actions.append(ToClient(p.error(code, message, stream=stream.id,
                                            retryable=not is_final)))
        if is_final:
            self._is_closed = True
            self._metrics.count_error(code.value)
            actions.append(ToClient(p.error(
                code, "the engine failed repeatedly (--max-engine-restarts); the server is exiting")))
            actions.append(Close(1011, "engine failed"))
        return actions

    # --- helpers ---------------------------------------------------------------------------

    def _audio_msg(self, stream: _Stream, msg: em.Audio) -> dict[str, Any] | None:
        if stream.resampler is None:
            return self._frame(stream, msg.pcm, msg.span, msg.t_emit)  # the engine's bytes
        stream.engine_samples += len(msg.pcm) // _SAMPLE_BYTES[ENGINE_FORMAT]
        stream.last_t_emit = msg.t_emit
        pcm = stream.resampler.resample(msg.pcm)
        if not pcm:  # the filter is filling: this chunk goes out with the next one
            if msg.span != stream.last_span:  # a segment not yet announced: the next frame's
                stream.held_span = _join_spans(stream.held_span, msg.span)
            return None
        span = _join_spans(stream.held_span, msg.span)
        stream.held_span = None
        return self._frame(stream, pcm, span, msg.t_emit)

    def _resampler_tail(self, stream: _Stream) -> list[Action]:
        """What a resampled stream's resampler holds, as an ``audio`` map (a flush's or the
        stream's end: no audio is left behind); nothing for other streams."""
        if stream.resampler is None:
            return []
        pcm = stream.resampler.drain()
        span = stream.held_span or stream.last_span
        stream.held_span = None
        return [ToClient(self._frame(stream, pcm, span, stream.last_t_emit))] if pcm else []

    def _frame(self, stream: _Stream, pcm: bytes, span: tuple[int, int] | None,
               t_emit: float) -> dict[str, Any]:
        now = self._clock()
        if stream.t_first_audio is None:
            stream.t_first_audio = now
            if stream.t_first_text is not None:
                self._metrics.observe_ttfa(now - stream.t_first_text)
        elif stream.t_last_audio is not None:
            self._metrics.observe_chunk_gap(now - stream.t_last_audio)
        stream.t_last_audio = now
        text = None
        if span is not None and span != stream.last_span:
            stream.last_span = span
            text = stream.text[span[0]:span[1]]
        out = p.audio(stream.id, seq=stream.seq, offset=stream.samples, pcm=pcm,
                      span=span, text=text)
        if self._debug_timestamps:
            out["engine_t"] = t_emit
        stream.seq += 1
        stream.samples += len(pcm) // _SAMPLE_BYTES[stream.fmt]
        return out

    def _done_msg(self, stream: _Stream, reason: str) -> dict[str, Any]:
        now = self._clock()
        timings: dict[str, float] = {
            "elapsed_s": round(now - stream.t_start, 6),
            "audio_s": round(stream.samples / stream.rate, 6),
        }
        if stream.t_first_text is not None and stream.t_first_audio is not None:
            timings["ttfa_ms"] = round((stream.t_first_audio - stream.t_first_text) * 1e3, 3)
        return p.done(stream.id, reason=reason, samples=stream.samples, **timings)

    def _forget(self, stream: _Stream) -> None:
        if self._streams.pop(stream.id, None) is not None:
            # at the model's rate, as the engine counts them (a resampled stream's own count)
            self._metrics.count_samples_sent(
                stream.samples if stream.resampler is None else stream.engine_samples)
        self._by_key.pop(stream.key, None)


def _join_spans(held: tuple[int, int] | None,
                span: tuple[int, int] | None) -> tuple[int, int] | None:
    """The span of a frame that carries held audio (``held``) and a chunk's (``span``)."""
    if held is None or span is None:
        return span if held is None else held
    return (min(held[0], span[0]), max(held[1], span[1]))
