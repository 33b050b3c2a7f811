"""Barge-in, measured: streams that are cancelled while they speak, as a voice agent does when
its user interrupts. Each stream sends its text, then ``cancel`` a set time after its first
audio; the client times ``cancel`` -> ``done`` and counts the audio that still reached it
after it sent ``cancel`` (frames already on the way), and the server's counters say how much
audio was made and never delivered because its stream was cancelled (held in the engine, or
reaching the gateway after the cancel).

    python -m benchmark.barge_in --streams 32 --rounds 5                 # starts voxgate serve (hibari)
    python -m benchmark.barge_in --serve-args "--model orpheus --load-format dummy" --streams 256
    python -m benchmark.barge_in --url ws://127.0.0.1:8000/v1/stream --streams 64

Figures and how to read them: benchmark/README.md, "Barge-in".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgpack
from websockets.asyncio.client import connect

from benchmark.bench.metrics import percentile
from benchmark.ipc import machine_description
from benchmark.serve_process import served
from benchmark.soak import _delta, _http, _settled_counters, read_counters

__all__ = ["Cut", "run", "main"]

_WORDS = ("Thanks for calling. I can help you with that order today. The package left our "
          "warehouse this morning and should arrive by Friday, weather permitting. Is there "
          "anything else you would like to know about it? I can also check on your other orders "
          "while we are on the line.").split()
_BYTES_PER_SAMPLE = {"pcm_s16le": 2, "pcm_f32le": 4}
_TIMEOUT_S = 120.0


@dataclass
class Cut:
    """One stream's barge-in, from the client's side."""

    reason: str  # done's reason ("cancelled": cut; "end" before the cancel was due: all sent) or "error:<code>"
    spoke_s: float  # audio received before the cancel was sent
    cancel_to_done_ms: float | None  # None: no cancel sent, or no done after it
    after_cancel_ms: float  # audio received after the cancel was sent (ms of audio)
    cancel_sent: bool = False

    @property
    def is_ok(self) -> bool:
        """Cut (a cancel sent, then done with reason cancelled), or ended with all its audio sent
        before its cancel was due."""
        return self.reason == ("cancelled" if self.cancel_sent else "end")


async def _cut_one(ws: Any, stream: str, fmt: str, after_s: float, rate: int) -> Cut:
    width = _BYTES_PER_SAMPLE[fmt]
    await ws.send(msgpack.packb({"type": "start", "stream": stream, "format": fmt}))
    for word in _WORDS:
        await ws.send(msgpack.packb({"type": "text", "stream": stream, "text": word + " "}))
    await ws.send(msgpack.packb({"type": "end", "stream": stream}))
    before = after = 0
    t_cancel: float | None = None
    cancel_at: float | None = None
    deadline = time.monotonic() + _TIMEOUT_S
    while True:
        timeout = deadline - time.monotonic()
        if t_cancel is None and cancel_at is not None:
            timeout = min(timeout, max(cancel_at - time.monotonic(), 0.0))
        try:
            raw = await asyncio.wait_for(ws.recv(), max(timeout, 0.0))
        except TimeoutError:
            if t_cancel is None and cancel_at is not None:  # time to interrupt
                t_cancel = time.monotonic()
                await ws.send(msgpack.packb({"type": "cancel", "stream": stream}))
                continue
            return Cut("timeout", before / rate, None, after / rate * 1000, t_cancel is not None)
        msg = msgpack.unpackb(raw)
        if msg.get("stream") != stream:
            continue
        kind = msg.get("type")
        if kind == "audio":
            n = len(msg["pcm"]) // width
            if t_cancel is None:
                before += n
                if cancel_at is None:  # the first audio: interrupt after_s from now
                    cancel_at = time.monotonic() + after_s
            else:
                after += n
        elif kind in ("done", "error"):
            t = time.monotonic()
            reason = str(msg.get("reason")) if kind == "done" else f"error:{msg.get('code')}"
            took = (t - t_cancel) * 1000 if t_cancel is not None else None
            return Cut(reason, before / rate, took, after / rate * 1000, t_cancel is not None)


async def _client(url: str, index: int, rounds: int, after_s: tuple[float, float], fmt: str,
                  seed: int, into: list[Cut], rates: set[int]) -> None:
    rng = random.Random(seed + index)
    async with connect(url, max_size=None) as ws:
        hello = msgpack.unpackb(await ws.recv())
        rate = int(hello.get("sample_rate") or 24000)
        rates.add(rate)
        for n in range(rounds):
            into.append(await _cut_one(ws, f"b{index}-{n}", fmt, rng.uniform(*after_s), rate))


async def run(url: str, *, num_streams: int, rounds: int, after_s: tuple[float, float],
              fmt: str = "pcm_s16le", seed: int = 0) -> dict[str, Any]:
    """``num_streams`` connections, each cutting ``rounds`` streams in turn; the figures."""
    hello_health = json.loads(await asyncio.to_thread(_http, url, "/health"))
    start = read_counters(await asyncio.to_thread(_http, url, "/metrics"))
    cuts: list[Cut] = []
    rates: set[int] = set()
    t0 = time.monotonic()
    await asyncio.gather(*(_client(url, i, rounds, after_s, fmt, seed, cuts, rates) for i in range(num_streams)))
    elapsed = time.monotonic() - t0
    end = await _settled_counters(url, timeout_s=30.0)  # (the engine's counters come once a second)
    rate = max(rates)  # the model's (hello)
    engines = hello_health.get("engines") or [{}]
    done = [c.cancel_to_done_ms for c in cuts if c.cancel_to_done_ms is not None]
    after = [c.after_cancel_ms for c in cuts if c.reason == "cancelled"]

    def pct(xs: list[float]) -> dict[str, float | None]:
        return {f"p{q}": (round(v, 3) if (v := percentile(xs, q)) is not None else None) for q in (50, 90, 99, 100)}

    dropped = _delta(end.gateway_dropped, start.gateway_dropped)
    engine_dropped = _delta(end.engine_dropped, start.engine_dropped)
    reasons: dict[str, int] = {}
    for c in cuts:
        reasons[c.reason] = reasons.get(c.reason, 0) + 1
    return {
        "streams": num_streams, "rounds": rounds, "after_s": list(after_s), "seconds": round(elapsed, 1),
        "sample_rate": rate,
        # a cancel was sent (the others ended, all their audio sent, before it was due)
        "cut_sent": sum(c.cancel_sent for c in cuts),
        "failed": sum(not c.is_ok for c in cuts),  # neither cut nor ended before its cancel
        "model": hello_health.get("model"), "device": engines[0].get("device"),
        "machine": machine_description(), "reasons": reasons,
        "cancel_to_done_ms": pct(done), "audio_after_cancel_ms": pct(after),
        "spoke_s_median": percentile([c.spoke_s for c in cuts], 50),
        # audio made and not delivered because its stream was cancelled, in seconds
        "gateway_dropped_cancelled_s": round(dropped.get("cancelled", 0.0) / rate, 3),
        "engine_dropped_cancelled_s": round(engine_dropped.get("cancelled", 0.0) / rate, 3),
        "cuts": [asdict(c) for c in cuts],
    }


def _report(r: dict[str, Any]) -> str:
    def row(name: str, d: dict[str, float | None], unit: str) -> str:
        return f"  {name}: " + ", ".join(f"{k} {v:.1f} {unit}" if v is not None else f"{k} -" for k, v in d.items())

    cut = r["reasons"].get("cancelled", 0)
    total = sum(r["reasons"].values())
    return "\n".join([
        f"barge-in: {r['streams']} connections x {r['rounds']} streams, each cancelled "
        f"{r['after_s'][0] * 1000:.0f}-{r['after_s'][1] * 1000:.0f} ms after its first audio; "
        f"model {r['model']} on {r['device']}; client on {r['machine']}",
        f"  streams: {total}; cancel sent to {r['cut_sent']} (the others ended, all their audio sent, "
        f"before it was due), ended as cancelled {cut}; done reasons {r['reasons']}; {r['seconds']:.1f} s",
        row("cancel -> done", r["cancel_to_done_ms"], "ms"),
        row("audio received after the cancel", r["audio_after_cancel_ms"], "ms of audio"),
        f"  audio made and not delivered, its stream cancelled: {r['engine_dropped_cancelled_s']:.2f} s held in "
        f"the engine, {r['gateway_dropped_cancelled_s']:.2f} s reaching the gateway after the cancel (the "
        "server's counters)",
        "  OK: every stream sent a cancel ended as cancelled, the others had ended" if not r["failed"]
        else f"  FAILED: {r['failed']} streams neither ended as cancelled after their cancel nor ended before it",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.barge_in", description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=32, help="concurrent connections, one stream at a time each (default 32)")
    ap.add_argument("--rounds", type=int, default=5, help="streams each connection cuts in turn (default 5)")
    ap.add_argument("--after-ms", default="100,1000",
                    help="the cancel comes this long after the stream's first audio: MS, or LOW,HIGH drawn "
                         "uniformly (default 100,1000)")
    ap.add_argument("--format", default="pcm_s16le", choices=sorted(_BYTES_PER_SAMPLE))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--url", default=None, help="a running server's ws://.../v1/stream (default: start one)")
    ap.add_argument("--serve-args", default="",
                    help="arguments of the voxgate serve this run starts (default: none, the embedded voice)")
    ap.add_argument("--start-timeout-s", type=float, default=900.0)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    try:
        bounds = [float(x) / 1000 for x in args.after_ms.split(",")]
    except ValueError:
        ap.error("--after-ms must be MS or LOW,HIGH")
    if len(bounds) == 1:
        bounds *= 2
    if len(bounds) != 2 or not 0 <= bounds[0] <= bounds[1]:
        ap.error("--after-ms must be MS or LOW,HIGH with 0 <= LOW <= HIGH")
    if args.streams < 1 or args.rounds < 1:
        ap.error("--streams and --rounds must be at least 1")
    with served(args.url, args.serve_args, connections=args.streams, start_timeout_s=args.start_timeout_s) as (url, _):
        result = asyncio.run(run(url, num_streams=args.streams, rounds=args.rounds,
                                 after_s=(bounds[0], bounds[1]), fmt=args.format, seed=args.seed))
    result["serve_args"] = args.serve_args if args.url is None else None
    print(_report(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if not result["failed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
