"""``BenchConfig``: everything one ``voxgate bench`` invocation does, validated, with messages that
name the command-line flag."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from benchmark.bench.targets import TARGETS

__all__ = ["BenchConfig", "FORMATS", "DEFAULT_URLS"]

FORMATS = ("pcm_s16le", "pcm_f32le")
DEFAULT_URLS = {"native": "ws://127.0.0.1:8000/v1/stream", "openai": "http://127.0.0.1:8000",
                "generate": "http://127.0.0.1:8000"}


@dataclass
class BenchConfig:
    target: str = "native"
    url: str | None = None  # None: DEFAULT_URLS[target]
    # Load: exactly one of concurrency levels, arrival rates, or a capacity search.
    concurrency: list[int] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)  # streams per second (open loop)
    search: bool = False
    search_start: int = 1
    search_max: int = 1024
    # Overload sweep: after the level(s), levels at these multiples of the capacity the search
    # found, or of the one --concurrency / --rate level given (e.g. [1.5, 2.0]).
    overload: list[float] = field(default_factory=list)
    arrival_shape: float = 1.0  # gamma shape of the gaps between arrivals; 1 = Poisson
    num_requests: int | None = None  # per level
    duration_s: float | None = None  # per level
    warmup: int = 0  # streams run (one at a time) before measuring, not counted
    ramp_s: float = 0.0
    seed: int = 0
    # Text.
    prompts_path: str | None = None
    min_words: int = 0
    max_words: int | None = None
    token_rate: float | None = None  # words per second when streaming text; None: all at once
    # Stream settings.
    voice: str | None = None
    format: str = "pcm_s16le"
    sample_rate: int | None = None  # native: start's sample_rate (the gateway resamples); None: the model's
    options: dict[str, Any] = field(default_factory=dict)
    streams_per_connection: int = 1
    timeout_s: float = 120.0
    # HTTP targets.
    http_model: str | None = None
    http_response_format: str = "pcm"
    http_sample_rate: int = 24000
    http_extra: dict[str, Any] = field(default_factory=dict)
    # Scoring.
    start_buffer_ms: float = 100.0
    ttfa_p90_max_ms: float = 300.0
    min_on_time: float = 0.99
    # Output.
    json_path: str | None = None
    plots_dir: str | None = None
    timeline_streams: int = 8
    asr: bool = False
    asr_max_streams: int = 20
    progress: bool = True

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"--target must be one of {', '.join(TARGETS)}, got {self.target!r}")
        if self.url is None:
            self.url = DEFAULT_URLS[self.target]
        scheme = self.url.split("://", 1)[0] if "://" in self.url else ""
        want = ("ws", "wss") if self.target == "native" else ("http", "https")
        if scheme not in want:
            raise ValueError(f"--url for --target {self.target} must start with "
                             f"{' or '.join(s + '://' for s in want)}, got {self.url!r}")
        modes = sum((bool(self.concurrency), bool(self.rate), self.search))
        if modes > 1:
            raise ValueError("give only one of --concurrency, --rate and --search")
        for f in self.overload:
            _check(math.isfinite(f) and 0 < f <= 10, f"--overload factors must be in (0, 10], got {f}")
        if self.overload and not (self.search or len(self.concurrency) + len(self.rate) == 1):
            raise ValueError("--overload multiplies one capacity: give --search, or exactly one "
                             "--concurrency or --rate level (the capacity measured before)")
        if modes == 0:
            self.concurrency = [1]
        for c in self.concurrency:
            _check(c >= 1, f"--concurrency levels must be >= 1, got {c}")
        for r in self.rate:
            _check(math.isfinite(r) and r > 0, f"--rate levels must be > 0 streams/s, got {r}")
        _check(1 <= self.search_start <= self.search_max,
               f"need 1 <= --search-start ({self.search_start}) <= --search-max "
               f"({self.search_max})")
        _check(math.isfinite(self.arrival_shape) and self.arrival_shape > 0,
               f"--arrival-shape must be > 0, got {self.arrival_shape}")
        if self.num_requests is not None and self.duration_s is not None:
            raise ValueError("give only one of --requests and --duration")
        _check(self.num_requests is None or self.num_requests >= 1,
               f"--requests must be >= 1, got {self.num_requests}")
        _check(self.duration_s is None or (math.isfinite(self.duration_s) and self.duration_s > 0),
               f"--duration must be > 0 seconds, got {self.duration_s}")
        _check(self.warmup >= 0, f"--warmup must be >= 0, got {self.warmup}")
        _check(self.ramp_s >= 0, f"--ramp must be >= 0 seconds, got {self.ramp_s}")
        _check(self.min_words >= 0, f"--min-words must be >= 0, got {self.min_words}")
        _check(self.max_words is None or self.max_words >= max(1, self.min_words),
               f"--max-words ({self.max_words}) must be >= --min-words ({self.min_words}) and >= 1")
        if self.token_rate is not None:
            _check(math.isfinite(self.token_rate) and self.token_rate > 0,
                   f"--token-rate must be > 0 words/s, got {self.token_rate}")
            _check(self.target == "native",
                   f"--token-rate streams text word by word, which only the native target can"
                   f" do (an HTTP request carries the whole text); drop it for --target "
                   f"{self.target}")
        _check(self.format in FORMATS, f"--format must be one of {', '.join(FORMATS)}")
        _check(1 <= self.streams_per_connection <= 1024,
               f"--streams-per-connection must be in [1, 1024], got "
               f"{self.streams_per_connection}")
        _check(self.timeout_s > 0, f"--timeout must be > 0 seconds, got {self.timeout_s}")
        _check(self.http_response_format in ("pcm", "wav"),
               f"--http-response-format must be pcm or wav, got {self.http_response_format!r}")
        _check(8000 <= self.http_sample_rate <= 192000,
               f"--http-sample-rate must be in [8000, 192000] Hz, got {self.http_sample_rate}")
        _check(0 <= self.start_buffer_ms <= 10_000,
               f"--start-buffer-ms must be in [0, 10000], got {self.start_buffer_ms}")
        _check(self.ttfa_p90_max_ms > 0, f"--ttfa-p90-max-ms must be > 0, got {self.ttfa_p90_max_ms}")
        _check(0 < self.min_on_time <= 1, f"--min-on-time must be in (0, 1], got {self.min_on_time}")
        _check(self.timeline_streams >= 0, "--timeline-streams must be >= 0")
        _check(self.asr_max_streams >= 1, f"--asr-max-streams must be >= 1, got {self.asr_max_streams}")

    @property
    def mode(self) -> str:
        return "rate" if self.rate else "concurrency"

    def overload_levels(self, base: float) -> list[float]:
        """The overload sweep's levels over ``base`` (whole streams in concurrency mode),
        without repeats, in order."""
        out: list[float] = []
        for f in self.overload:
            level = float(max(1, round(base * f))) if self.mode == "concurrency" else base * f
            if level not in out:
                out.append(level)
        return out

    def requests_for(self, level: float) -> int | None:
        """Streams in a level when bounded by count: --requests, else a default of about three
        rounds of the concurrency (at least 20), or about 30 s of arrivals (at least 20)."""
        if self.duration_s is not None:
            return None
        if self.num_requests is not None:
            return self.num_requests
        if self.mode == "rate":
            return max(20, math.ceil(30 * level))
        return max(20, 3 * int(level))


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
