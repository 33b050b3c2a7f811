"""The engine's logic, streams in and audio out: segments become backend jobs spoken in order, streams
are admitted by measured capacity (docs/architecture.md, "Engine"; docs/scheduling.md). Plain
Python, no I/O, drivable from a test.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from engine.admission import Admission, AdmissionConfig
from engine.backend import Backend, JobOutput, OptionError
from engine.messages import Audio, Done, Error, Flushed, Message, Started, VoiceRef
from engine.segmenter import Segment, Segmenter

__all__ = ["CoreConfig", "EngineCore"]


# The engine encodes PCM in each stream's format, so that the gateway's one event loop only
# forwards bytes.
_BYTES_PER_SAMPLE = {"pcm_f32le": 4, "pcm_s16le": 2}  # the formats the core encodes


class _PcmEncoder:
    """A step's chunks of one format encoded with one pass of numpy calls into buffers kept
    from step to step: at chunk sizes the calls' fixed cost is most of the work, and fresh
    arrays of a few MB a step cost their pages' first touch as much again (873 frames of 1,920
    samples: 13 to 7 us a chunk on the development machine)."""

    def __init__(self) -> None:
        self._f32 = np.empty(0, dtype=np.float32)
        self._i16 = np.empty(0, dtype="<i2")

    def encode(self, fmt: str, pcms: list[np.ndarray]) -> list[bytes]:
        """Each chunk's bytes: pcm_f32le as little-endian float32, pcm_s16le as
        clip(x, -1, 1) * 32767 rounded toward zero."""
        n = sum(p.size for p in pcms)
        if self._f32.size < n:
            self._f32 = np.empty(n, dtype=np.float32)
        x = self._f32[:n]
        np.concatenate([p.reshape(-1) for p in pcms], out=x, casting="same_kind")
        if fmt == "pcm_s16le":
            np.multiply(x, np.float32(32767.0), out=x)
            if self._i16.size < n:
                self._i16 = np.empty(n, dtype="<i2")
            y = self._i16[:n]
            np.clip(x, -32767.0, 32767.0, out=y, casting="unsafe")  # the cast truncates toward zero
        elif fmt == "pcm_f32le":
            y = x.astype("<f4", copy=False)  # a view on a little-endian host
        else:
            raise ValueError(f"unknown PCM format {fmt!r}")
        # each chunk's bytes copied once, straight from the buffer (one bytes of the whole step,
        # then sliced, copied every sample twice)
        out: list[bytes] = []
        pos = 0
        for pcm in pcms:
            end = pos + pcm.size
            out.append(y[pos:end].tobytes())
            pos = end
        return out


@dataclass(frozen=True)
class CoreConfig:
    lookahead_jobs: int = 1  # segments generated ahead of the one being spoken
    first_segment_min_chars: int = 12
    min_segment_chars: int = 40
    max_segment_chars: int = 300
    max_streams: int = 4096
    # Deadlines given to backends that schedule by them (``set_deadline``): a stream's first
    # audio is due this long after its first segment; a segment generated ahead is due this
    # long after its stream's audio so far would have played out, and never sooner than this
    # long from now.
    first_audio_budget_s: float = 0.15
    lookahead_slack_s: float = 1.0

    def new_segmenter(self) -> Segmenter:
        """A stream's segmenter with these settings."""
        return Segmenter(first_segment_min_chars=self.first_segment_min_chars,
                         min_segment_chars=self.min_segment_chars, max_segment_chars=self.max_segment_chars)

    def __post_init__(self) -> None:
        if self.lookahead_jobs < 0:
            raise ValueError("lookahead_jobs must be >= 0")
        if self.max_streams < 1:
            raise ValueError("max_streams must be >= 1")


@dataclass
class _Job:
    job_id: int
    segment: Segment
    held: list[np.ndarray] = field(default_factory=list)  # audio made before its turn
    is_finished: bool = False


@dataclass
class _Stream:
    key: int
    voice: str
    options: dict[str, Any]
    segmenter: Segmenter
    fmt: str  # PCM format of this stream's Audio messages
    pending: deque[Segment] = field(default_factory=deque)  # not yet given to the backend
    jobs: deque[_Job] = field(default_factory=deque)  # submitted, in speaking order
    is_ended: bool = False
    samples: int = 0
    t_open: float = 0.0
    t_first_text: float | None = None
    t_first_audio: float | None = None
    # Admission (engine.admission): at the first job; while waiting, segments stay in
    # ``pending`` (an input-streaming turn's text in ``held_text``).
    is_admitted: bool = False
    is_waiting: bool = False
    t_queued: float | None = None
    queue_wait_s: float = 0.0
    held_text: str = ""
    held_flush: bool = False
    # Flush acknowledgements (``Flushed``): segments made so far and spoken so far, and for
    # each flush not yet acknowledged, (its ordinal, the segments it waits for).
    num_segments: int = 0
    num_segments_spoken: int = 0
    num_flushes: int = 0
    flush_marks: deque[tuple[int, int]] = field(default_factory=deque)


class EngineCore:
    """Streams -> segments -> backend jobs -> ordered audio messages."""

    def __init__(
        self,
        backend: Backend,
        config: CoreConfig | None = None,
        *,
        admission: AdmissionConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.config = config or CoreConfig()
        self._clock = clock
        # Streams are admitted at their first job against the capacity measured from the
        # backend's steps (``note_step``); see engine.admission and docs/scheduling.md.
        admission = admission or AdmissionConfig()
        if admission.decode_cap_budget < 0:  # the model's own (an LM program's, LMBackend's)
            admission = replace(admission, decode_cap_budget=float(getattr(backend, "default_decode_cap_budget", 0.0)))
        self.admission = Admission(
            admission, tokens_per_audio_second=getattr(backend.info, "tokens_per_audio_second", None),
            max_streams=self.config.max_streams, job_slots=int(getattr(backend, "job_slots", 0) or 0),
            clock=clock)
        self._streams: dict[int, _Stream] = {}
        self._job_owner: dict[int, int] = {}  # job id -> stream key
        self._next_job_id = 1
        self._set_deadline = getattr(backend, "set_deadline", None)
        # The measured decode cap (``AdmissionConfig.decode_cap_budget``), for a backend that can
        # take one: never above the backend's own cap (or its batch slots) as it starts.
        self._decode_cap_limit = 0
        if self.admission.config.decode_cap_budget and hasattr(backend, "set_decode_cap"):
            self._decode_cap_limit = int(getattr(backend, "max_decode_rows", 0) or 0)
        self._decode_cap = self._decode_cap_limit
        # Stream key -> PCM format of the Audio made in the current step, whose ``pcm`` holds
        # the samples until ``step`` encodes them all at once (``_encode_step_audio``).
        self._step_formats: dict[int, str] = {}
        self._encoder = _PcmEncoder()  # its buffers are kept from step to step
        # A backend that takes text as it arrives gets one job per turn (no segmenter).
        self._input_streaming = bool(getattr(backend.info, "input_streaming", False))
        # Sample accounting (Stats totals, for the soak): the backend's audio is sent in Audio,
        # dropped (made for a stream since cancelled, or held back for one that failed), or
        # held for a stream still open.
        self.num_samples_made = 0
        self.num_samples_sent = 0
        self.num_samples_dropped = {"cancelled": 0, "failed": 0}

    # --- commands --------------------------------------------------------------------------

    def open(self, key: int, voice: str | None, options: dict[str, Any],
             fmt: str = "pcm_f32le", voice_ref: VoiceRef | None = None) -> list[Message]:
        """Open a stream; with ``voice_ref`` (a registered voice) the backend's
        ``prepare_voice`` names the voice, and ``voice`` is ignored."""
        if key in self._streams:
            return [Error(key, "stream_exists", f"stream key {key} is already open", False)]
        if len(self._streams) >= self.config.max_streams:
            return [Error(key, "capacity", f"server at capacity: {len(self._streams)} streams open "
                          f"(max_streams={self.config.max_streams}); retry later", True)]
        try:
            if voice_ref is not None:
                prepare = getattr(self.backend, "prepare_voice", None)
                if prepare is None or not self.backend.info.supports_cloning:
                    info = self.backend.info
                    return [Error(key, "cloning_unsupported",
                                  f"model {info.model} cannot clone voices; use one of its "
                                  f"built-in voices: {', '.join(info.voices)}", False)]
                voice = prepare(voice_ref)
            voice, options = self.backend.validate(voice, dict(options))
        except OptionError as exc:
            return [Error(key, exc.code, str(exc), False)]
        segmenter = self.config.new_segmenter()
        if fmt not in _BYTES_PER_SAMPLE:
            return [Error(key, "unsupported_format", f"format must be one of {sorted(_BYTES_PER_SAMPLE)}",
                          False)]
        self._streams[key] = _Stream(key, voice, options, segmenter, fmt, t_open=self._clock())
        return [Started(key, voice, options)]

    def add_text(self, key: int, text: str) -> list[Message]:
        stream = self._streams.get(key)
        if stream is None or stream.is_ended:
            return []  # the gateway validates; late text for a gone stream is dropped
        if stream.t_first_text is None and text.strip():
            stream.t_first_text = self._clock()
        if self._input_streaming:
            return self._stream_text(stream, text)
        self._add_segments(stream, stream.segmenter.push(text))
        return self._submit(stream)

    def flush(self, key: int) -> list[Message]:
        stream = self._streams.get(key)
        if stream is None or stream.is_ended:
            return []
        stream.num_flushes += 1
        if self._input_streaming:  # the backend does not say when a flush's audio is out
            out = self._stream_text(stream, "", flush=True)
            return out + [Flushed(key, stream.num_flushes)]
        self._add_segments(stream, stream.segmenter.flush())
        stream.flush_marks.append((stream.num_flushes, stream.num_segments))
        out = self._submit(stream)
        return out + self._flushed(stream) if self._streams.get(key) is stream else out

    def end(self, key: int) -> list[Message]:
        stream = self._streams.get(key)
        if stream is None or stream.is_ended:
            return []
        stream.is_ended = True
        if self._input_streaming:
            if stream.jobs:
                self.backend.push_text(stream.jobs[0].job_id, "", final=True)  # type: ignore[attr-defined]
            return self._maybe_done(stream)
        self._add_segments(stream, stream.segmenter.end())
        return self._submit(stream) + self._maybe_done(stream)

    def cancel(self, key: int) -> list[Message]:
        stream = self._streams.pop(key, None)
        if stream is None:
            return []
        self.admission.release(key)
        self._abort_jobs(stream, "cancelled")
        return [self._done(stream, "cancelled")]

    # --- admission -------------------------------------------------------------------------

    def poll(self) -> list[Message]:
        """Admit the waiting streams that fit now, in order; refuse those that waited
        ``max_wait_s``. The process loop calls it after each round of commands and steps."""
        if not self.admission.num_queued:
            return []
        admitted, refused = self.admission.poll()
        out: list[Message] = []
        for key, decision in refused:
            stream = self._streams.pop(key, None)
            if stream is not None:
                out.append(Error(key, "capacity", decision.message, True, decision.retry_after_s))
        for key in admitted:
            stream = self._streams.get(key)
            if stream is not None:
                out.extend(self._on_admitted(stream))
            else:
                self.admission.release(key)
        return out

    def next_poll_s(self) -> float | None:
        """Seconds until ``poll`` has a waiting stream to refuse (None: nobody waits)."""
        return self.admission.next_timeout_s()

    def note_step(self, rows: int, prompt_tokens: int, seconds: float, *, max_rows: int = 0,
                  fill_rows: int = 0) -> None:
        """One backend step the engine ran back to back with the one before: its decode rows,
        prompt tokens and wall seconds, and the backend's decode cap and fill (the capacity
        estimate, which also counts the jobs the streams hold: segments generated ahead decode
        beside the spoken ones)."""
        self.admission.observe_step(rows, prompt_tokens, seconds, max_rows=max_rows, fill_rows=fill_rows,
                                    jobs=len(self._job_owner))
        if self._decode_cap_limit:  # the measured decode cap (AdmissionConfig.decode_cap_budget)
            cap = self.admission.measured_decode_cap(self._decode_cap_limit)
            # (a change under 2% is left for the next: each one makes the capacity estimate anew)
            if cap is not None and abs(cap - self._decode_cap) > self._decode_cap // 50:
                self._decode_cap = cap
                self.backend.set_decode_cap(cap)  # type: ignore[attr-defined]

    def _request_admission(self, stream: _Stream) -> list[Message]:
        """At a stream's first job: admitted (``is_admitted``), waiting, or refused (gone)."""
        decision = self.admission.request(stream.key)
        if decision.verdict == "admit":
            stream.is_admitted = True
            return []
        if decision.verdict == "queue":
            stream.is_waiting = True
            stream.t_queued = self._clock()
            return []
        self._streams.pop(stream.key, None)
        stream.pending.clear()
        return [Error(stream.key, "capacity", decision.message, True, decision.retry_after_s)]

    def _on_admitted(self, stream: _Stream) -> list[Message]:
        """A waiting stream got room: its segments (or its turn's text) go to the backend."""
        stream.is_waiting = False
        stream.is_admitted = True
        if stream.t_queued is not None:
            stream.queue_wait_s = self._clock() - stream.t_queued
        if not self._input_streaming:
            return self._submit(stream) + self._maybe_done(stream)
        text, stream.held_text = stream.held_text, ""
        out = self._stream_text(stream, text, flush=stream.held_flush)
        if stream.is_ended and stream.jobs:
            self.backend.push_text(stream.jobs[0].job_id, "", final=True)  # type: ignore[attr-defined]
        return out + self._maybe_done(stream)

    # --- the loop --------------------------------------------------------------------------

    def has_work(self) -> bool:
        return self.backend.has_work()

    def step(self) -> list[Message]:
        """One backend step; its outputs become ordered ``Audio``/``Done``/``Error`` messages."""
        out: list[Message] = []
        self._step_formats.clear()
        owner, streams = self._job_owner, self._streams
        for result in self.backend.step():
            pcm = result.pcm
            if pcm is not None:
                self.num_samples_made += pcm.size
            key = owner.get(result.job_id)
            stream = streams.get(key) if key is not None else None
            if stream is None:
                owner.pop(result.job_id, None)
                if pcm is not None:
                    self.num_samples_dropped["cancelled"] += pcm.size
                continue
            jobs = stream.jobs
            if (len(jobs) == 1 and jobs[0].job_id == result.job_id and pcm is not None and pcm.size
                    and not result.is_finished and result.error is None):
                # the common case, as _on_output takes it: more audio of a stream's only job
                out.append(self._audio(stream, jobs[0], pcm))
                self._schedule(stream, jobs[0])
                continue
            out.extend(self._on_output(stream, result))
        if self._step_formats:
            self._encode_step_audio(out)
        return out

    def _encode_step_audio(self, out: list[Message]) -> None:
        """Replace the samples in this step's Audio by their bytes, one numpy pass per format."""
        formats = self._step_formats
        by_format: dict[str, list[int]] = {}
        for i, msg in enumerate(out):
            if type(msg) is Audio:
                by_format.setdefault(formats[msg.key], []).append(i)
        for fmt, indices in by_format.items():
            pcms = [out[i].pcm for i in indices]  # type: ignore[attr-defined]
            for i, data in zip(indices, self._encoder.encode(fmt, pcms)):
                msg = out[i]
                out[i] = Audio(msg.key, data, msg.span, msg.t_emit)  # type: ignore[attr-defined]
        formats.clear()

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    def stream_keys(self) -> list[int]:
        return list(self._streams)

    def sample_totals(self) -> dict[str, float]:
        """Samples made by the backend, sent in Audio, and dropped by reason, since start."""
        totals = {"samples_made": self.num_samples_made, "samples_sent": self.num_samples_sent}
        totals.update({f"samples_dropped_{why}": n for why, n in self.num_samples_dropped.items()})
        return totals  # type: ignore[return-value]

    # --- internals -------------------------------------------------------------------------

    def _submit(self, stream: _Stream) -> list[Message]:
        if not stream.is_admitted:
            if not stream.pending or stream.is_waiting:
                return []
            refused = self._request_admission(stream)
            if not stream.is_admitted:
                return refused
        limit = 1 + self.config.lookahead_jobs
        while stream.pending and len(stream.jobs) < limit:
            segment = stream.pending.popleft()
            job = _Job(self._next_job_id, segment)
            self._next_job_id += 1
            stream.jobs.append(job)
            self._job_owner[job.job_id] = stream.key
            self.backend.add_job(job.job_id, segment.text, stream.voice, stream.options)
            self._schedule(stream, job)
        return []

    def _stream_text(self, stream: _Stream, text: str, *, flush: bool = False) -> list[Message]:
        """Input streaming: the turn's one job gets the text as it comes (its span grows)."""
        if not stream.jobs:
            if stream.is_waiting:  # for admission: the text waits with it
                stream.held_text += text
                stream.held_flush = stream.held_flush or flush
                return []
            if not text:
                return []
            if not stream.is_admitted:
                out = self._request_admission(stream)
                if not stream.is_admitted:
                    return out if not stream.is_waiting else self._stream_text(stream, text, flush=flush)
            job = _Job(self._next_job_id, Segment(text, 0, len(text)))
            self._next_job_id += 1
            stream.jobs.append(job)
            self._job_owner[job.job_id] = stream.key
            self.backend.add_job(job.job_id, text, stream.voice, stream.options)
            if flush:
                self.backend.push_text(job.job_id, "", flush=True)  # type: ignore[attr-defined]
            self._schedule(stream, job)
            return []
        job = stream.jobs[0]
        seg = job.segment
        job.segment = Segment(seg.text + text, 0, seg.end + len(text))
        self.backend.push_text(job.job_id, text, flush=flush)  # type: ignore[attr-defined]
        return []

    def _schedule(self, stream: _Stream, job: _Job) -> None:
        """Tell a deadline-aware backend when this job's next audio is needed."""
        if self._set_deadline is None:
            return
        cfg = self.config
        now = self._clock()
        first = stream.t_first_audio is None
        if first:
            due = now + cfg.first_audio_budget_s  # not yet speaking: soon
        else:  # when the client's playback, started at the first audio, runs dry
            due = stream.t_first_audio + stream.samples / self.backend.info.sample_rate
        if job is not stream.jobs[0]:
            # after the head's audio runs out, and never sooner than the slack from now: a
            # stream that is behind needs its head's audio, not the next segment's (which is
            # held until the head ends), so its segment ahead does not compete with heads
            due = max(due, now) + cfg.lookahead_slack_s
        # (first: a target for the first audio, not the moment a playing client runs dry)
        self._set_deadline(job.job_id, due, first_audio=first and job is stream.jobs[0])

    def _on_output(self, stream: _Stream, result: JobOutput) -> list[Message]:
        if result.error is not None:
            self._streams.pop(stream.key, None)
            self.admission.release(stream.key)
            self._abort_jobs(stream, "failed")
            if result.pcm is not None:
                self.num_samples_dropped["failed"] += result.pcm.size
            err = result.error
            return [Error(stream.key, err.code, err.message, err.retryable)]
        job = next((j for j in stream.jobs if j.job_id == result.job_id), None)
        if job is None:
            if result.pcm is not None:
                self.num_samples_dropped["cancelled"] += result.pcm.size
            return []
        out: list[Message] = []
        if result.pcm is not None and result.pcm.size:
            if job is stream.jobs[0]:
                out.append(self._audio(stream, job, result.pcm))
                if not result.is_finished:
                    self._schedule(stream, job)  # more audio sent: its next is due later
                for ahead in itertools.islice(stream.jobs, 1, None):  # needed after the head's: later too
                    if not ahead.is_finished:
                        self._schedule(stream, ahead)
            else:  # a copy: the backend's array may be a view of a buffer its next step reuses
                job.held.append(result.pcm.copy())
        if result.is_finished:
            job.is_finished = True
            self._job_owner.pop(job.job_id, None)
            out.extend(self._advance(stream))
        return out

    def _advance(self, stream: _Stream) -> list[Message]:
        """Retire finished head jobs; release the next job's held audio."""
        out: list[Message] = []
        while stream.jobs and stream.jobs[0].is_finished:
            stream.jobs.popleft()
            stream.num_segments_spoken += 1
            out.extend(self._flushed(stream))  # before the next segment's held audio
            if stream.jobs:
                head = stream.jobs[0]
                out.extend(self._audio(stream, head, pcm) for pcm in head.held)
                head.held.clear()
                if not head.is_finished:
                    self._schedule(stream, head)
        self._submit(stream)
        out.extend(self._maybe_done(stream))
        return out

    def _add_segments(self, stream: _Stream, segments: list[Segment]) -> None:
        stream.pending.extend(segments)
        stream.num_segments += len(segments)

    def _flushed(self, stream: _Stream) -> list[Message]:
        """``Flushed`` for each flush whose segments have all been spoken."""
        out: list[Message] = []
        marks = stream.flush_marks
        while marks and marks[0][1] <= stream.num_segments_spoken:
            out.append(Flushed(stream.key, marks.popleft()[0]))
        return out

    def _audio(self, stream: _Stream, job: _Job, pcm: np.ndarray) -> Audio:
        """Audio whose ``pcm`` holds the samples; ``step`` encodes them before returning."""
        now = self._clock()
        if stream.t_first_audio is None:
            stream.t_first_audio = now
        stream.samples += int(pcm.size)
        self.num_samples_sent += int(pcm.size)
        self._step_formats[stream.key] = stream.fmt
        return Audio(stream.key, pcm, (job.segment.start, job.segment.end), now)  # type: ignore[arg-type]

    def _maybe_done(self, stream: _Stream) -> list[Message]:
        if stream.is_waiting or self._streams.get(stream.key) is not stream:
            return []  # waiting for admission, or refused
        if stream.is_ended and not stream.pending and not stream.jobs:
            self._streams.pop(stream.key, None)
            self.admission.release(stream.key)
            return [self._done(stream, "end")]
        return []

    def _done(self, stream: _Stream, reason: str) -> Done:
        now = self._clock()
        rate = self.backend.info.sample_rate
        timings = {"elapsed_s": now - stream.t_open, "audio_s": stream.samples / rate}
        if stream.t_first_text is not None and stream.t_first_audio is not None:
            timings["ttfa_ms"] = (stream.t_first_audio - stream.t_first_text) * 1000.0
        if stream.t_queued is not None:  # it waited for admission (part of its ttfa_ms)
            wait = stream.queue_wait_s if not stream.is_waiting else now - stream.t_queued
            timings["queue_wait_ms"] = wait * 1000.0
        return Done(stream.key, reason, stream.samples, timings)

    def _abort_jobs(self, stream: _Stream, reason: str) -> None:
        for job in stream.jobs:
            self.num_samples_dropped[reason] += sum(pcm.size for pcm in job.held)
            self.backend.abort_job(job.job_id)
            self._job_owner.pop(job.job_id, None)
        stream.jobs.clear()
        stream.pending.clear()
