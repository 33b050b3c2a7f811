"""Orpheus served on a modelled GPU: the engine's own ``EngineCore`` (segments, lookahead, deadlines,
admission by measured capacity), ``LMBackend`` (asynchronous steps) and ``Scheduler`` on a
simulated clock, with a stand-in runner whose steps take what a model of the GPU says and a
stand-in program that makes a frame of audio every 7 tokens; clients as ``voxgate bench``'s
concurrency mode runs them (docs/scheduling.md, "Orpheus near its capacity: a model").

    python -m benchmark.orpheus_sim [--streams 448,512] [--gpu h100-f904384] [--cap 384,448]
        [--budget 0,0.85] [--headroom 0.1] [--ramp-s 10] [--duration-s 15] [--slots 1024,2048]
        [--prefill-token-buckets none default 32,64,96,128,192,256,384,512]

An estimate, not a measurement. Step times (``GpuSteps``) are the engine alone's decode step by
rows (``benchmark.gpu.engine_profile``, medians) plus a prefill pass for a step with prompts and
the codec's share per frame, fitted to a served timeline; the host's own work is a cost per call
(the runner's launch before the device may start, the rest beside it). Not modelled: the host's
jitter and GC pauses, the fast-start ramp's shorter first chunks (every frame is 2,048 samples),
the gateway and its network. Use it to choose what to measure.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from benchmark.light_steps_sim import _interp
from engine.admission import AdmissionConfig
from engine.backend import BackendInfo
from engine.core import CoreConfig, EngineCore
from engine.llm.backend import LMBackend
from engine.llm.page_allocator import PageAllocator
from engine.llm.scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from engine.llm.sequence import SamplingParams
from engine.messages import Audio, Done, Error
from engine.step_time import StepSampler

__all__ = ["GPUS", "GpuSteps", "SimResult", "main", "simulate", "timeline"]

TOKENS_PER_FRAME = 7
FRAME_SAMPLES = 2048
SAMPLE_RATE = 24000
TOKENS_PER_AUDIO_S = TOKENS_PER_FRAME * SAMPLE_RATE / FRAME_SAMPLES  # 82.03
REFUSAL_BACKOFF_S = (0.05, 5.0)  # benchmark.bench.load.REFUSAL_BACKOFF_S's bounds


@dataclass(frozen=True)
class GpuSteps:
    """A step's device milliseconds: the decode step by rows (linear between the points, and
    past the last on its last segment's slope), plus ``prefill_ms + prefill_token_ms`` x tokens
    when the step has prompts (a second pass over the weights: the prefill graph), plus
    ``codec_frame_ms`` per frame the step before completed (the codec's kernels share the GPU).
    ``prefill_buckets``: the prefill graphs' token counts, a pass's tokens padded up to the next
    (``()``: unpadded, as the prefill terms were fitted; the served runner pads to
    ``DEFAULT_PREFILL_BUCKETS`` or ``--prefill-token-buckets``).
    The host: ``launch_ms`` (+ ``launch_row_us`` a row) before the device can start a step,
    ``after_ms`` (+ ``after_row_us``) after it has the tokens of the one before."""

    name: str
    decode_ms: tuple[tuple[int, float], ...]
    prefill_ms: float = 3.0
    prefill_token_ms: float = 0.01
    codec_frame_ms: float = 0.03
    jitter: float = 0.08  # each step's time times a log-normal factor of this spread (served steps vary)
    launch_ms: float = 0.4
    launch_row_us: float = 4.0
    after_ms: float = 0.5
    after_row_us: float = 3.0
    prefill_buckets: tuple[int, ...] = ()
    source: str = ""

    def padded(self, tokens: int) -> int:
        """A prefill pass's tokens as its graph runs them: the next bucket up (the tokens
        themselves past the last, or without buckets)."""
        i = bisect.bisect_left(self.prefill_buckets, tokens)
        return self.prefill_buckets[i] if i < len(self.prefill_buckets) else tokens

    def device_ms(self, rows: int, prompt_tokens: int, frames_before: int) -> float:
        ms = _interp(max(rows, 1), self.decode_ms) if rows else 0.0
        if prompt_tokens:
            ms += self.prefill_ms + self.prefill_token_ms * self.padded(prompt_tokens)
        return ms + self.codec_frame_ms * frames_before


# The engine alone (``engine_profile --steps 40 --max-tokens 170``, medians, codec included, no
# prompts) on the GPU and commit named; the prefill and codec terms fitted so that the served
# timeline of the first (docs/performance.md: bfb65d34, level 448 over 10 s) comes out: 256-row
# seconds at 8.3-9.5 ms a step, 384-row ones at 10.5-11.4 ms, about 2 prompts a step.
GPUS: dict[str, GpuSteps] = {g.name: g for g in (
    GpuSteps("h100-f904384", ((1, 3.7), (256, 7.11), (332, 8.44), (448, 9.6)),
             source="H100 bfb65d34 at f904384 (256 / 332 rows; one row: the served single stream; 448: "
                    "c8b9bcf4's slope)"),
    GpuSteps("h100-917c63f", ((1, 3.7), (256, 6.44), (448, 8.10)),
             source="H100 c8b9bcf4 at 917c63f, the rotation kernel (its A/B, performance.md)"),
    GpuSteps("h200-4c3cad4", ((1, 3.4), (256, 5.92), (384, 7.95), (512, 8.16)),
             source="H200 at 4c3cad4 (run 27's engine alone, bf16, before the codec fixes; uuid not recorded)"),
)}


@dataclass
class SimResult:
    offered: int
    ttfa_ms: list[float] = field(default_factory=list)
    streams: int = 0
    refused: int = 0
    queued: int = 0  # admitted after waiting
    underran: int = 0
    steps: int = 0
    rows: int = 0
    loaded_ms: list[tuple[float, int, float]] = field(default_factory=list)  # (t, rows, ms): decode-only steps
    step_log: list[tuple[float, int, int, int, float]] = field(default_factory=list)  # (t, rows, prompts, tokens, ms)
    capacity: list[tuple[float, int | None]] = field(default_factory=list)  # (t, estimate) a second
    admission: list[dict[str, Any]] = field(default_factory=list)  # the engine's admission snapshot a second
    decode_caps: list[int] = field(default_factory=list)
    on_time_audio_s: float = 0.0  # audio of the streams that never underran
    wall_s: float = 0.0

    @property
    def goodput(self) -> float:
        """On-time audio seconds per second of the run, as ``voxgate bench`` reports it."""
        return self.on_time_audio_s / self.wall_s if self.wall_s > 0 else 0.0

    def pct(self, q: float) -> float:
        xs = sorted(self.ttfa_ms)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else math.nan

    @property
    def admitted(self) -> int:
        return self.streams - self.refused

    @property
    def admitted_on_time(self) -> float:
        return (self.admitted - self.underran) / self.admitted if self.admitted else math.nan

    @property
    def on_time(self) -> float:
        """As ``voxgate bench`` counts it: streams that never underran among all offered (refused
        ones count against it)."""
        return (self.admitted - self.underran) / self.streams if self.streams else math.nan


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Launched:
    """``LaunchedStep``'s shape: calling it waits (on the simulated clock) for the step's end."""

    def __init__(self, clock: _Clock, end: float, n: int) -> None:
        self._clock, self._end, self._n = clock, end, n
        self.tokens = None  # (no device tokens: the program ignores the values)

    def __call__(self) -> list[int]:
        self._clock.now = max(self._clock.now, self._end)
        return [0] * self._n


class _Runner:
    """A model runner whose device is ``GpuSteps``: a launch costs the host its time, the step
    runs when the device is free, the tokens come at its end."""

    def __init__(self, clock: _Clock, gpu: GpuSteps, program: _Program, result: SimResult, seed: int = 0) -> None:
        self.clock, self.gpu, self.program, self.result = clock, gpu, program, result
        self.gpu_free = 0.0
        self.launches = 0
        self._rng = np.random.default_rng(seed)

    def launch(self, batch: ScheduledBatch, feed: Any = None) -> _Launched:
        g = self.gpu
        self.launches += 1
        rows = batch.num_decode_seqs
        self.clock.now += (g.launch_ms + g.launch_row_us * 1e-3 * batch.num_seqs) / 1e3
        prompt_tokens = batch.num_tokens - rows
        ms = g.device_ms(rows, prompt_tokens, self.program.take_frames())
        if g.jitter:
            ms *= float(self._rng.lognormal(-g.jitter ** 2 / 2, g.jitter))  # (mean 1)
        start = max(self.clock.now, self.gpu_free)
        self.gpu_free = start + ms / 1e3
        if rows and not prompt_tokens:
            self.result.loaded_ms.append((start, rows, ms))
        self.result.step_log.append((start, rows, batch.num_seqs - rows, prompt_tokens, ms))
        return _Launched(self.clock, self.gpu_free, batch.num_seqs)


@dataclass
class _State:
    tokens: int = 0


class _Program:
    """Orpheus's contract in outline: a prompt of the text's tokens and 8 specials, a frame of
    2,048 samples each 7th token, no stop (random weights: every segment makes its max_tokens)."""

    stop_ids: frozenset[int] = frozenset()
    vocab_ids = None
    allowed_table = None

    def __init__(self) -> None:
        self.info = BackendInfo(model="orpheus-sim", voices=("tara",), default_voice="tara",
                                sample_rate=SAMPLE_RATE, tokens_per_audio_second=TOKENS_PER_AUDIO_S)
        self._frames = 0
        self._pcm = np.zeros(FRAME_SAMPLES, np.float32)

    def take_frames(self) -> int:
        n, self._frames = self._frames, 0
        return n

    def validate(self, voice: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return voice or "tara", options

    def build_prompt(self, text: str, voice: str, options: dict[str, Any]) -> list[int]:
        return [1] * (8 + max(1, round(len(f"{voice}: {text}") / 4.3)))  # Llama 3's ~4.3 characters a token

    def sampling_params(self, options: dict[str, Any]) -> SamplingParams:
        return SamplingParams(max_tokens=int(options.get("max_tokens", 170)))

    def new_state(self, voice: str, options: dict[str, Any]) -> _State:
        return _State()

    def allowed_row(self, state: _State, ahead: int = 0) -> int:
        return 0

    def launch_postprocess(self, states: list[_State], tokens: list[Any]):
        out: list[np.ndarray | None] = []
        for s in states:
            s.tokens += 1
            done = s.tokens % TOKENS_PER_FRAME == 0
            out.append(self._pcm if done else None)
            self._frames += done
        return lambda: out

    def launch_finish(self, states: list[_State]):
        return lambda: [None] * len(states)

    def release(self, state: _State) -> None:
        pass

    def note_step_interval(self, seconds: float) -> None:
        pass

    def note_due(self, state: _State, due_in_s: float) -> None:
        pass


@dataclass
class _Client:
    start: float
    first_audio: float | None = None
    samples: int = 0
    underruns: int = 0


def simulate(offered: int, *, gpu: GpuSteps, cap: int = 384, budget: float = 0.0, headroom: float = 0.1,
             ramp_s: float = 10.0, duration_s: float = 15.0, texts: list[str] | None = None,
             max_tokens: int = 170, fill: int = 256, horizon_s: float = 1.0, prefill_wait_s: float = 0.05,
             prefill_batch: int = 8, start_buffer_s: float = 0.1, policy: str = "queue",
             hold_undue_prompts: bool = False, slots: int = 1024) -> SimResult:
    """``offered`` clients in ``voxgate bench``'s concurrency mode (first starts evenly over
    ``ramp_s``, each starting its next stream when its last ends or, refused, after the
    retry-after hint; no new stream after ``duration_s``); the server as Orpheus's defaults
    before session 48 set it on CUDA (``cap``: the decode cap; ``budget``: ``--decode-cap-budget``,
    the cap then measured below ``cap``; ``headroom``: admission's; ``slots``: ``--max-num-seqs``,
    the jobs at once, two a speaking stream); its defaults since are
    ``cap=512, budget=0.85, prefill_wait_s=0.1, prefill_batch=16`` with the finer prefill counts
    (``models.orpheus.build``). Every stream's text is sent at once."""
    from benchmark.bench.prompts import filter_prompts, load_prompts

    texts = texts or filter_prompts(load_prompts(), min_words=30, max_words=50)
    clock = _Clock()
    result = SimResult(offered)
    program = _Program()
    runner = _Runner(clock, gpu, program, result)
    sched = Scheduler(SchedulerConfig(
        max_num_seqs=slots, max_num_batched_tokens=slots + 256, max_model_len=2048, max_waiting=4096,
        max_num_prefill_seqs=16, max_num_prefill_tokens=512, max_num_decode_seqs=cap, decode_horizon_s=horizon_s,
        decode_fill_seqs=fill, prefill_wait_s=prefill_wait_s, prefill_batch_seqs=prefill_batch, whole_prompts=True,
        hold_undue_prompts=hold_undue_prompts),
        PageAllocator(slots * 14 + 1, 16), clock=clock)
    backend = LMBackend(program, runner, sched, async_steps=True)  # type: ignore[arg-type]
    core = EngineCore(backend, CoreConfig(), clock=clock,
                      admission=AdmissionConfig(policy=policy, headroom=headroom, decode_cap_budget=budget))
    sampler = StepSampler(lag=1)
    clients: dict[int, _Client] = {}
    starts: list[tuple[float, int]] = [(ramp_s * w / offered, w) for w in range(offered)]  # (when, worker)
    owner: dict[int, int] = {}  # stream key -> worker
    next_key = 0
    next_stat = 0.0

    def start(worker: int) -> list[Any]:
        nonlocal next_key
        key, next_key = next_key, next_key + 1
        owner[key] = worker
        clients[key] = _Client(clock.now)
        result.streams += 1
        text = texts[key % len(texts)]
        return core.open(key, "tara", {"max_tokens": max_tokens}, "pcm_s16le") + core.add_text(key, text) + core.end(key)

    def handle(messages: list[Any]) -> None:
        for msg in messages:
            c = clients.get(getattr(msg, "key", -1))
            if c is None:
                continue
            if isinstance(msg, Audio):
                n = len(msg.pcm) // 2
                if c.first_audio is None:
                    c.first_audio = clock.now
                    result.ttfa_ms.append(1e3 * (clock.now - c.start))
                elif clock.now > c.first_audio + start_buffer_s + c.samples / SAMPLE_RATE:
                    c.underruns += 1
                c.samples += n
            elif isinstance(msg, (Done, Error)):
                del clients[msg.key]
                w = owner.pop(msg.key)
                again = clock.now
                if isinstance(msg, Error):
                    result.refused += msg.code == "capacity"
                    lo, hi = REFUSAL_BACKOFF_S
                    again += min(max(msg.retry_after_s or 1.0, lo), hi)
                else:
                    result.underran += c.underruns > 0
                    if not c.underruns:
                        result.on_time_audio_s += c.samples / SAMPLE_RATE
                if again < duration_s:
                    bisect.insort(starts, (again, w))

    while starts or clients:
        while starts and starts[0][0] <= clock.now:
            handle(start(starts.pop(0)[1]))
        if core.has_work():
            counts = backend.step_counts()
            t0, launches = clock.now, runner.launches
            out = core.step()
            if runner.launches == launches and clock.now == t0:  # nothing launched nor waited for: a pause
                clock.now += 1e-3
            after = backend.step_counts()
            clock.now += (gpu.after_ms + gpu.after_row_us * 1e-3 * (after[0] - counts[0])) / 1e3
            sample = sampler.on_step(t0, after[0] - counts[0], after[1] - counts[1])
            if sample is not None:
                core.note_step(*sample, max_rows=backend.max_decode_rows, fill_rows=backend.decode_fill_rows)
            result.steps += 1
            result.rows += after[0] - counts[0]
            handle(out)
        else:
            sampler.reset()
            nxt = [starts[0][0]] if starts else []
            wait = core.next_poll_s()
            if wait is not None:
                nxt.append(clock.now + wait)
            if not nxt:
                break
            clock.now = max(clock.now, min(nxt))
        handle(core.poll())
        if clock.now >= next_stat:
            next_stat = clock.now + 1.0
            result.capacity.append((clock.now, core.admission.capacity()))
            result.admission.append(dict(core.admission.snapshot(), t=clock.now, speaking=core.admission.demand))
            result.decode_caps.append(backend.max_decode_rows)
    result.queued = core.admission.counters.admitted_after_wait
    result.wall_s = clock.now
    return result


def timeline(r: SimResult) -> list[str]:
    """A line a second of the run, as ``benchmark.timeline`` prints a served level's: steps, decode
    rows, prompts and prompt tokens a step, the device's ms a step, streams speaking and the
    capacity estimate."""
    by: dict[int, list[tuple[int, int, int, float]]] = {}
    for t, rows, prompts, tokens, ms in r.step_log:
        by.setdefault(int(t), []).append((rows, prompts, tokens, ms))
    speaking = {int(a["t"]): (a["speaking"], a["capacity"]) for a in r.admission}
    out = ["   t s  steps rows/step prompts/step tokens/step device ms/step speaking capacity"]
    for sec in sorted(by):
        v = by[sec]
        n = len(v)
        spk, cap = speaking.get(sec, ("-", "-"))
        out.append(f"{sec:6d} {n:6d} {sum(x[0] for x in v) / n:9.0f} {sum(x[1] for x in v) / n:12.2f} "
                   f"{sum(x[2] for x in v) / n:11.1f} {sum(x[3] for x in v) / n:14.2f} {spk!s:>8} {cap!s:>8}")
    return out


def _buckets(text: str) -> tuple[int, ...]:
    """``--prefill-token-buckets``'s value: none, default or increasing counts (the serve option's parser)."""
    from engine.llm.scheduler import parse_token_buckets

    if text == "none":
        return ()
    if text == "default":
        from engine.llm.prefill_graphs import DEFAULT_PREFILL_BUCKETS

        return tuple(DEFAULT_PREFILL_BUCKETS)
    return parse_token_buckets(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", default="448,512")
    p.add_argument("--gpu", default="h100-f904384", choices=sorted(GPUS), help="the step model (GPUS)")
    p.add_argument("--cap", default="384", help="decode caps (--max-num-decode-seqs), comma-separated")
    p.add_argument("--budget", default="0", help="--decode-cap-budget values (0: off)")
    p.add_argument("--headroom", default="0.1", help="admission headroom values")
    p.add_argument("--slots", default="1024", help="--max-num-seqs values (jobs at once; a speaking stream holds two)")
    p.add_argument("--policy", default="queue", choices=["queue", "refuse", "off"])
    p.add_argument("--ramp-s", type=float, default=10.0)
    p.add_argument("--duration-s", type=float, default=15.0)
    p.add_argument("--prefill-batch", default="8", help="prefill_batch_seqs values")
    p.add_argument("--prefill-wait-s", type=float, default=0.05, help="prefill_wait_s")
    p.add_argument("--hold-undue-prompts", action="store_true", help="SchedulerConfig.hold_undue_prompts")
    p.add_argument("--prefill-token-buckets", nargs="+", default=["none"], metavar="COUNTS",
                   help="the prefill graphs' token counts, each run in turn: none (tokens unpadded, as the "
                        "prefill terms were fitted), default (the runner's) or N,N,...")
    p.add_argument("--timeline", action="store_true", help="each run's seconds too")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="a GpuSteps number changed (prefill_ms=1.0: cheaper prompt passes), repeatable")
    args = p.parse_args(argv)
    gpu = GPUS[args.gpu]
    for item in args.set:
        name, _, value = item.partition("=")
        if name not in {f for f in GpuSteps.__dataclass_fields__ if f not in ("name", "decode_ms", "source")}:
            p.error(f"--set {item}: not a GpuSteps number")
        gpu = replace(gpu, **{name: float(value)})
    floats = lambda v: [float(x) for x in v.split(",")]  # noqa: E731
    ints = lambda v: [int(x) for x in v.split(",")]  # noqa: E731
    try:
        buckets = {name: _buckets(name) for name in args.prefill_token_buckets}
    except ValueError as e:
        p.error(f"--prefill-token-buckets: {e}")
    print(f"Orpheus on a modelled GPU: {gpu.name} ({gpu.source}); an estimate (benchmark/orpheus_sim.py)")
    print("  " + ", ".join(f"{k} {getattr(gpu, k)}" for k in GpuSteps.__dataclass_fields__
                           if k not in ("name", "source", "prefill_buckets")))  # (the buckets: a column)
    print(f"ramp {args.ramp_s:g} s, level {args.duration_s:g} s, policy {args.policy}")
    print("offered slots   cap budget headroom pbatch streams refused queued underran on time  admitted on time  "
          "TTFA p50   p90  capacity (median)  cap in force  400+ row steps ms (p50)  goodput  buckets")
    sweep = itertools.product(ints(args.streams), ints(args.slots), ints(args.cap), floats(args.budget),
                              floats(args.headroom), ints(args.prefill_batch), buckets.items())
    for n, slots, cap, budget, headroom, pb, (bname, counts) in sweep:
        r = simulate(n, gpu=replace(gpu, prefill_buckets=counts), cap=cap, budget=budget, headroom=headroom,
                     ramp_s=args.ramp_s, duration_s=args.duration_s, prefill_batch=pb, policy=args.policy,
                     prefill_wait_s=args.prefill_wait_s, hold_undue_prompts=args.hold_undue_prompts, slots=slots)
        caps = sorted(c for _, c in r.capacity if c is not None)
        big = sorted(ms for _, rows, ms in r.loaded_ms if rows >= 400)
        in_force = sorted(r.decode_caps)
        print(f"{n:7d} {slots:5d} {cap:5d} {budget:6.2f} {headroom:8.2f} {pb:6d} {r.streams:7d} {r.refused:7d} "
              f"{r.queued:6d} {r.underran:8d} {100 * r.on_time:7.1f}% {100 * r.admitted_on_time:16.1f}% "
              f"{r.pct(0.5):9.0f} {r.pct(0.9):5.0f} "
              f"{caps[len(caps) // 2] if caps else '-':>18} {in_force[len(in_force) // 2]:>13} "
              f"{big[len(big) // 2] if big else float('nan'):>24.2f} {r.goodput:8.1f}  {bname}", flush=True)
        if args.timeline:
            print("\n".join(timeline(r)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
