"""What a start's ``sample_rate`` costs the gateway's event loop: ``Session.on_audio`` per engine
chunk for a stream at the model's rate (the engine's bytes passed through) and for streams
resampled to other rates, side by side in one process (no sockets, no engine).

    python -m benchmark.resample_cost --model-rate 24000 --chunk-ms 40 --rates 8000,16000,48000

Medians over ``--repeats`` runs of ``--chunks`` chunks each; the ratio is to the pass-through.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import time
from typing import Any

import numpy as np

from engine import messages as em
from gateway.session import Session

__all__ = ["chunk_cost_us", "main"]

_LIMITS = {"max_streams_per_connection": 1, "max_text_chars_per_stream": 100,
           "max_frame_bytes": 1 << 20, "idle_timeout_s": 60}


def _session(model_rate: int) -> Session:
    keys = itertools.count(1)
    return Session(hello=em.Hello("bench", ["v"], "v", model_rate, {}), limits=_LIMITS,
                   allocate_key=lambda: next(keys), is_engine_ready=lambda: True)


def chunk_cost_us(*, model_rate: int, rate: int | None, fmt: str, chunk_ms: float,
                  num_chunks: int) -> float:
    """Mean microseconds of ``on_audio`` per chunk for one stream (``rate`` None: not resampled)."""
    s = _session(model_rate)
    start: dict[str, Any] = {"type": "start", "stream": "x", "format": fmt}
    if rate is not None:
        start["sample_rate"] = rate
    s.receive_frame(json.dumps(start))
    n = round(model_rate * chunk_ms / 1000)
    x = (0.3 * np.sin(2 * np.pi * 220 * np.arange(n) / model_rate)).astype(np.float32)  # [n]
    engine_fmt = fmt if rate is None or rate == model_rate else "pcm_f32le"
    pcm = x.tobytes() if engine_fmt == "pcm_f32le" else (x * 32767).astype("<i2").tobytes()
    msg = em.Audio(1, pcm, (0, 10), 0.0)
    t0 = time.perf_counter()
    for _ in range(num_chunks):
        s.on_audio(msg)
    return (time.perf_counter() - t0) / num_chunks * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-rate", type=int, default=24000)
    ap.add_argument("--chunk-ms", type=float, default=40.0)
    ap.add_argument("--rates", default="8000,16000,22050,44100,48000")
    ap.add_argument("--format", default="pcm_s16le", choices=["pcm_s16le", "pcm_f32le"])
    ap.add_argument("--chunks", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    rates: list[int | None] = [None, *(int(r) for r in args.rates.split(","))]
    runs: dict[str, list[float]] = {str(rate or "native"): [] for rate in rates}
    for _ in range(args.repeats):  # interleaved, so that drift hits every rate alike
        for rate in rates:
            runs[str(rate or "native")].append(chunk_cost_us(
                model_rate=args.model_rate, rate=rate, fmt=args.format,
                chunk_ms=args.chunk_ms, num_chunks=args.chunks))
    base = statistics.median(runs["native"])
    print(f"machine: {platform.processor() or platform.machine()}, python "
          f"{platform.python_version()}; model rate {args.model_rate} Hz, "
          f"{args.chunk_ms:g} ms chunks, {args.format}")
    for name, values in runs.items():
        med = statistics.median(values)
        print(f"  {name:>7}: {med:7.1f} us per chunk (x{med / base:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
