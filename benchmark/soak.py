"""A soak: N streams for M minutes against one server, with every audio sample accounted for.

    python -m benchmark.soak --streams 64 --minutes 10            # starts voxgate serve --model synthetic
    python -m benchmark.soak --streams 256 --minutes 10 \
        --serve-args "--model orpheus --load-format dummy --device cuda"
    python -m benchmark.soak --url ws://127.0.0.1:8000/v1/stream --gateway-pid 1234 --streams 32

``unaccounted`` (made, less received, less every reported drop) must be 0; the accounting
and what is read: benchmark/README.md. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgpack
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect

from benchmark.bench.server_stats import metrics_url, parse_totals
from benchmark.serve_process import served

__all__ = ["ClientTally", "Counters", "Accounting", "account", "read_counters", "main"]

_WORDS = ("Thanks for calling. I can help you with that order today. The package left our "
          "warehouse this morning and should arrive by Friday, weather permitting. Is there "
          "anything else you would like to know about it?").split()
_BYTES_PER_SAMPLE = {"pcm_s16le": 2, "pcm_f32le": 4}


@dataclass
class ClientTally:
    """What the clients saw, summed over their streams."""

    streams: int = 0
    ended: int = 0
    cancelled: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    samples_received: int = 0
    samples_done: int = 0  # done.samples summed: what the gateway says it sent
    barge_in_dropped: int = 0  # cancelled streams: done.samples not received
    short_ended: int = 0  # ended streams that received fewer samples than done.samples
    retry_wait_s: float = 0.0  # summed waits for a refusal's retry_after_s before the next stream

    def add(self, other: ClientTally) -> None:
        for name in ("streams", "ended", "cancelled", "samples_received", "samples_done",
                     "barge_in_dropped", "short_ended", "retry_wait_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for code, n in other.errors.items():
            self.errors[code] = self.errors.get(code, 0) + n


@dataclass(frozen=True)
class Counters:
    """The server's counters that the accounting reads, at one moment."""

    engine_made: float = 0.0
    engine_sent: float = 0.0
    engine_dropped: dict[str, float] = field(default_factory=dict)
    gateway_sent: float = 0.0
    gateway_dropped: dict[str, float] = field(default_factory=dict)
    engine_restarts: float = 0.0


@dataclass(frozen=True)
class Accounting:
    engine_made: int
    engine_sent: int
    engine_dropped: dict[str, int]
    gateway_sent: int
    gateway_dropped: dict[str, int]
    client_received: int
    client_barge_in_dropped: int
    unaccounted: int  # must be 0
    engine_balance: int  # engine made - sent - dropped: must be 0
    gateway_balance: int  # engine sent - gateway sent - gateway dropped: must be 0
    client_balance: int  # gateway sent - client done.samples: must be 0
    engine_restarts: int

    @property
    def is_balanced(self) -> bool:
        return (self.unaccounted == 0 and self.engine_balance == 0 and self.gateway_balance == 0
                and self.client_balance == 0 and self.engine_restarts == 0)


def read_counters(text: str) -> Counters:
    """The accounting's counters from a Prometheus exposition of the gateway."""
    engine = parse_totals(text)
    gateway_sent = 0.0
    gateway_dropped: dict[str, float] = {}
    restarts = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "voxgate_audio_samples_sent_total":
                gateway_sent = float(sample.value)
            elif sample.name == "voxgate_audio_samples_dropped_total":
                gateway_dropped[sample.labels.get("reason", "?")] = float(sample.value)
            elif sample.name == "voxgate_engine_restarts_total":
                restarts = float(sample.value)
    dropped = {name.removeprefix("samples_dropped_"): v for name, v in engine.items()
               if name.startswith("samples_dropped_")}
    return Counters(engine.get("samples_made", 0.0), engine.get("samples_sent", 0.0), dropped,
                    gateway_sent, gateway_dropped, restarts)


def _delta(end: dict[str, float], start: dict[str, float]) -> dict[str, int]:
    return {k: int(end.get(k, 0) - start.get(k, 0)) for k in sorted(set(end) | set(start))}


def account(start: Counters, end: Counters, clients: ClientTally) -> Accounting:
    """The run's sample accounting from the counters' growth and the clients' tally."""
    made = int(end.engine_made - start.engine_made)
    sent = int(end.engine_sent - start.engine_sent)
    e_drop = _delta(end.engine_dropped, start.engine_dropped)
    g_sent = int(end.gateway_sent - start.gateway_sent)
    g_drop = _delta(end.gateway_dropped, start.gateway_dropped)
    reported = sum(e_drop.values()) + sum(g_drop.values()) + clients.barge_in_dropped
    return Accounting(
        engine_made=made, engine_sent=sent, engine_dropped=e_drop, gateway_sent=g_sent,
        gateway_dropped=g_drop, client_received=clients.samples_received,
        client_barge_in_dropped=clients.barge_in_dropped,
        unaccounted=made - clients.samples_received - reported,
        engine_balance=made - sent - sum(e_drop.values()),
        gateway_balance=sent - g_sent - sum(g_drop.values()),
        client_balance=g_sent - clients.samples_done,
        engine_restarts=int(end.engine_restarts - start.engine_restarts),
    )


# --- the clients -----------------------------------------------------------------------------


async def _speak_one(ws: Any, stream: str, fmt: str, cancel: bool) -> tuple[ClientTally, float]:
    """One stream; with the seconds a refusal asks to wait before the next (0 otherwise)."""
    tally = ClientTally(streams=1)
    retry_after = 0.0
    await ws.send(msgpack.packb({"type": "start", "stream": stream, "format": fmt}))
    for word in _WORDS:
        await ws.send(msgpack.packb({"type": "text", "stream": stream, "text": word + " "}))
    if not cancel:
        await ws.send(msgpack.packb({"type": "end", "stream": stream}))
    width = _BYTES_PER_SAMPLE[fmt]
    received = 0
    while True:
        msg = msgpack.unpackb(await asyncio.wait_for(ws.recv(), 120))
        if msg.get("stream") != stream:
            continue
        kind = msg["type"]
        if kind == "audio":
            received += len(msg["pcm"]) // width
            if cancel and msg["seq"] == 0:
                await ws.send(msgpack.packb({"type": "cancel", "stream": stream}))
        elif kind == "done":
            tally.samples_done += msg["samples"]
            if msg["reason"] == "cancelled":
                tally.cancelled += 1
                tally.barge_in_dropped += msg["samples"] - received
            else:
                tally.ended += 1
                tally.short_ended += received != msg["samples"]
            break
        elif kind == "error":
            tally.errors[msg["code"]] = tally.errors.get(msg["code"], 0) + 1
            if msg.get("retryable"):
                retry_after = float(msg.get("retry_after_s") or 0.0)
            break
    tally.samples_received = received
    return tally, retry_after


async def _client(url: str, index: int, deadline: float, cancel_every: int, into: ClientTally) -> None:
    async with connect(url, max_size=None) as ws:
        await ws.recv()  # hello
        n = 0
        while time.monotonic() < deadline:
            fmt = "pcm_f32le" if (index + n) % 4 == 0 else "pcm_s16le"
            cancel = cancel_every > 0 and (index + n) % cancel_every == cancel_every - 1
            tally, retry_after = await _speak_one(ws, f"c{index}-{n}", fmt, cancel)
            n += 1
            # a refused client waits what the server asked, as a well-behaved one would
            wait = min(retry_after, max(0.0, deadline - time.monotonic()))
            tally.retry_wait_s = wait
            into.add(tally)
            if wait > 0:
                await asyncio.sleep(wait)


# --- the server ------------------------------------------------------------------------------


def rss_mib(pid: int | None) -> float | None:
    """Resident memory of a process in MiB (``/proc/PID/status``), or None."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _http(ws_url: str, path: str) -> str:
    url = metrics_url(ws_url).removesuffix("/metrics") + path
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 (the user's own server)
        return resp.read().decode()


def _engine_pid(url: str) -> int | None:
    return json.loads(_http(url, "/health"))["engine"]["pid"]


async def _settled_counters(url: str, timeout_s: float) -> Counters:
    """The counters once the engine's last Stats (sent once a second) cover the run's end."""
    deadline = time.monotonic() + timeout_s
    last: Counters | None = None
    while True:
        now = read_counters(await asyncio.to_thread(_http, url, "/metrics"))
        if last is not None and now == last:
            return now  # two reads a Stats interval apart agree
        if time.monotonic() > deadline:
            return now
        last = now
        await asyncio.sleep(1.5)  # polling the server's counters, not synchronising


def _memory(url: str, gateway_pid: int | None) -> dict[str, float | None]:
    return {"gateway_rss_mib": rss_mib(gateway_pid), "engine_rss_mib": rss_mib(_engine_pid(url))}


async def run(url: str, *, num_streams: int, seconds: float, cancel_every: int,
              gateway_pid: int | None, rss_every_s: float) -> dict[str, Any]:
    start = read_counters(await asyncio.to_thread(_http, url, "/metrics"))
    memory = [{"t_s": 0.0, **_memory(url, gateway_pid)}]
    t0 = time.monotonic()
    deadline = t0 + seconds
    tally = ClientTally()
    clients = [asyncio.create_task(_client(url, i, deadline, cancel_every, tally))
               for i in range(num_streams)]
    waiter = asyncio.gather(*clients)
    while not waiter.done():
        await asyncio.wait([waiter], timeout=rss_every_s)
        memory.append({"t_s": round(time.monotonic() - t0, 1), **_memory(url, gateway_pid)})
    await waiter
    elapsed = time.monotonic() - t0
    end = await _settled_counters(url, timeout_s=30.0)
    memory.append({"t_s": round(time.monotonic() - t0, 1), **_memory(url, gateway_pid)})
    acc = account(start, end, tally)
    return {"streams": num_streams, "seconds": round(elapsed, 1), "clients": asdict(tally),
            "accounting": {**asdict(acc), "is_balanced": acc.is_balanced}, "memory": memory,
            "machine": f"{platform.node()} ({platform.processor() or platform.machine()}, "
                       f"{os.cpu_count()} CPUs)"}


def _report(result: dict[str, Any]) -> str:
    acc, cl, mem = result["accounting"], result["clients"], result["memory"]

    def rss(row: dict[str, Any]) -> str:
        g, e = row["gateway_rss_mib"], row["engine_rss_mib"]
        return (f"gateway {g:.1f} MiB" if g is not None else "gateway ?") + (
            f", engine {e:.1f} MiB" if e is not None else ", engine ?")

    lines = [
        f"soak: {result['streams']} concurrent streams for {result['seconds']:.0f} s on {result['machine']}",
        f"  streams {cl['streams']} (ended {cl['ended']}, cancelled {cl['cancelled']}, errors {cl['errors'] or 0}; "
        f"waited {cl.get('retry_wait_s', 0.0):.0f} s in all for refusals' retry_after_s)",
        f"  samples made {acc['engine_made']:,}; sent by the engine {acc['engine_sent']:,}, dropped in the "
        f"engine {acc['engine_dropped']}; sent to clients {acc['gateway_sent']:,}, dropped in the gateway "
        f"{acc['gateway_dropped']}; received by clients {acc['client_received']:,}, dropped at barge-in "
        f"{acc['client_barge_in_dropped']:,}",
        f"  unaccounted {acc['unaccounted']} (balances: engine {acc['engine_balance']}, gateway "
        f"{acc['gateway_balance']}, clients {acc['client_balance']}; engine restarts "
        f"{acc['engine_restarts']}; ended streams short of done.samples: {cl['short_ended']})",
        f"  memory at start: {rss(mem[0])}; at end: {rss(mem[-1])}; peak gateway "
        f"{max((r['gateway_rss_mib'] or 0) for r in mem):.1f} MiB, engine "
        f"{max((r['engine_rss_mib'] or 0) for r in mem):.1f} MiB",
        "  OK: every sample accounted for" if acc["is_balanced"] and cl["short_ended"] == 0
        else "  FAILED: samples unaccounted for",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=64, help="concurrent streams (connections) (default 64)")
    ap.add_argument("--minutes", type=float, default=10.0, help="how long new streams start (default 10)")
    ap.add_argument("--cancel-fraction", type=float, default=0.1,
                    help="share of streams cancelled after their first audio (default 0.1; 0 none)")
    ap.add_argument("--url", default=None, help="a running server's ws://.../v1/stream (default: start one)")
    ap.add_argument("--gateway-pid", type=int, default=None, help="with --url: the gateway's pid, for its RSS")
    ap.add_argument("--serve-args", default="--model synthetic",
                    help="arguments of the voxgate serve this run starts (default '--model synthetic')")
    ap.add_argument("--start-timeout-s", type=float, default=900.0, help="for the server to start")
    ap.add_argument("--rss-every-s", type=float, default=30.0, help="memory read interval (default 30)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    if not 0.0 <= args.cancel_fraction <= 1.0:
        ap.error("--cancel-fraction must be in [0, 1]")
    cancel_every = round(1 / args.cancel_fraction) if args.cancel_fraction > 0 else 0
    with served(args.url, args.serve_args, connections=args.streams, start_timeout_s=args.start_timeout_s,
                gateway_pid=args.gateway_pid) as (url, gateway_pid):
        result = asyncio.run(run(url, num_streams=args.streams, seconds=args.minutes * 60,
                                 cancel_every=cancel_every, gateway_pid=gateway_pid,
                                 rss_every_s=args.rss_every_s))
    result["serve_args"] = args.serve_args if args.url is None else None
    print(_report(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    ok = result["accounting"]["is_balanced"] and result["clients"]["short_ended"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
