"""What the benchmark records about one stream (receipt times on ``time.monotonic()``, the clock of
the engine's ``engine_t``), filled in by a target and read by the metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["StreamTrace", "REFUSAL_CODES"]

# Error codes that mean "full, retry later" rather than a failure: voxgate's `capacity` and an
# HTTP server's 429 Too Many Requests.
REFUSAL_CODES = ("capacity", "http_429")


@dataclass
class StreamTrace:
    stream_id: str
    prompt_index: int
    text: str
    level: float = 0.0  # the load level (concurrency or rate) this stream ran under
    sample_rate: int | None = None
    bytes_per_sample: int = 2
    t_start: float | None = None  # the stream was issued (before connecting / sending start)
    t_first_text: float | None = None  # the first text left the client
    t_end_input: float | None = None  # the last text (and `end`) left the client
    t_done: float | None = None  # `done`, the end of the HTTP body, or the error
    chunk_t: list[float] = field(default_factory=list)  # receipt time of each audio chunk
    chunk_samples: list[int] = field(default_factory=list)  # samples in each chunk
    chunk_engine_t: list[float] = field(default_factory=list)  # engine emit time, where sent
    done_reason: str | None = None  # "end", "cancelled"; "eof" for an HTTP body that ended
    error_code: str | None = None
    error_message: str | None = None
    retry_after_s: float | None = None  # a refusal's hint (native: the error's retry_after_s)
    server_timings: dict[str, Any] = field(default_factory=dict)
    offset_mismatches: int = 0  # audio chunks whose `offset` did not follow the previous one
    num_samples: int = 0  # sum of chunk_samples, kept up to date by add_chunk
    pcm: bytearray | None = None  # the audio itself, kept only for --asr

    @property
    def is_refused(self) -> bool:
        """The server turned the stream away because it was full (``REFUSAL_CODES``)."""
        return self.error_code in REFUSAL_CODES

    @property
    def is_ok(self) -> bool:
        """Finished normally (no error, not cancelled)."""
        return self.error_code is None and self.done_reason in ("end", "eof")

    def add_chunk(self, t_recv: float, num_samples: int, engine_t: float | None = None) -> None:
        self.chunk_t.append(t_recv)
        self.chunk_samples.append(num_samples)
        self.num_samples += num_samples
        if engine_t is not None:
            self.chunk_engine_t.append(engine_t)

    def fail(self, code: str, message: str, t: float) -> None:
        """Record the first error only: later ones are consequences of it."""
        if self.error_code is None:
            self.error_code = code
            self.error_message = message
        if self.t_done is None:
            self.t_done = t
