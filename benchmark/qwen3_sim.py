"""Qwen3-TTS's scheduling replayed on a modelled GPU: the engine's own ``Scheduler`` driven by a
simulated clock, steps asynchronous as ``LMBackend`` runs them, with step times as the served
H200 runs of session 37 show them, for streams started over a ramp and replaced as they end;
the program's settings (fill, decode horizon, prefill wait) or cheaper rows changed one at a
time (docs/scheduling.md, "Qwen3-TTS near its throughput").

    python -m benchmark.qwen3_sim [--streams 832,896,960,1024] [--fill 256] [--row-cost 1,0.85]

An estimate, not a measurement: step times are a model (``FrameSteps``: decode rows to wall
milliseconds, the engine loop's work included, linear between the points the served timelines
give, plus a cost per prompt), the engine core's deadlines are reproduced (first audio due
0.15 s after a stream's start, then when its client's playback runs dry), every stream is
admitted (admission off) and the client plays from its first audio with a 100 ms buffer, as
``voxgate bench`` counts it. Against the served levels of session 37 (15 s, first starts over
10 s): TTFA p50 / p90 121 / 173 ms at 832 streams (served 127 / 178), 127 / 239 at 896 (133 /
263-267), 136 / 258 at 960 (135-136 / 302-307), where 282 streams underran in the model and
none served: it is pessimistic about throughput at the top. The host's jitter, GC pauses and
the codec's own stream are not modelled. Use it to choose what to measure.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from benchmark.light_steps_sim import _interp
from benchmark.sched_sim import SimResult, StreamShape, run
from engine.llm.page_allocator import PageAllocator
from engine.llm.scheduler import ScheduledBatch, Scheduler, SchedulerConfig

__all__ = ["FrameSteps", "SimResult", "main", "simulate"]

FRAME_S = 0.08  # Qwen3-TTS's frame: 12.5 a second
FRAMES = 125  # 10 s streams, as [Q]
PROMPT_TOKENS = 7  # a turn's prompt with the text fed one token a frame (served: ~23 tokens a step, ~3.3 prompts)


@dataclass(frozen=True)
class FrameSteps:
    """Wall milliseconds an engine step takes by decode rows, the engine loop's work included
    (what admission's fit samples: one call's start to the next): the served timelines of
    743e4974 and 38302929 at `e307713` (steps a second at 256, 552, 748 and 873 rows, their prompts included: 29.4, 50,
    66.7 and 83 ms; one stream 8.9 ms), the last point extrapolated on that line; plus 0.3 ms
    a prompt (the served steps' fit). The GPU runs one step behind the host (asynchronous
    steps); the loop's own work is not modelled apart."""

    rows_ms: tuple[tuple[int, float], ...] = ((1, 8.9), (8, 11.2), (256, 29.4), (552, 50.0), (748, 66.7),
                                              (873, 78.0), (1024, 90.0))
    prompt_ms: float = 0.3
    row_cost: float = 1.0  # the cost of every row past the first, scaled: 0.85 = rows 15% cheaper

    def wall_ms(self, rows: int, prompts: int) -> float:
        one = self.rows_ms[0][1]
        return one + self.row_cost * (_interp(max(rows, 1), self.rows_ms) - one) + self.prompt_ms * prompts


def simulate(streams: int, *, ramp_s: float = 10.0, duration_s: float = 15.0,
             model: FrameSteps | None = None, fill: int = 256, horizon_s: float = 1.0,
             prefill_wait_s: float = 0.05, start_buffer_s: float = 0.1) -> SimResult:
    """Streams started evenly over ``ramp_s`` and, while ``duration_s`` lasts, each replaced as
    its last audio arrives (``voxgate bench``'s concurrency mode), steps asynchronous as
    ``LMBackend`` runs them on CUDA (``benchmark.sched_sim``); every stream's TTFA and underruns.
    ``fill``, ``horizon_s`` and ``prefill_wait_s``: the scheduler's settings (Qwen3-TTS's
    defaults: 256, 1 s and 0.05 s)."""
    model = model or FrameSteps()
    now = [0.0]
    cfg = SchedulerConfig(max_num_seqs=2048, max_num_batched_tokens=4096, max_model_len=512, max_waiting=4096,
                          max_num_prefill_seqs=32, max_num_prefill_tokens=512, whole_prompts=True,
                          decode_horizon_s=horizon_s, decode_fill_seqs=fill, prefill_wait_s=prefill_wait_s,
                          prefill_batch_seqs=8)
    sched = Scheduler(cfg, PageAllocator(2048 * 10 + 1, 16), clock=lambda: now[0])

    def step_ms(batch: ScheduledBatch) -> float:
        return model.wall_ms(batch.num_decode_seqs, batch.num_seqs - batch.num_decode_seqs)

    shape = StreamShape(prompt_tokens=PROMPT_TOKENS, first_audio_token=0, audio_frames=FRAMES, frame_s=FRAME_S,
                        start_buffer_s=start_buffer_s)
    return run(sched, now, shape, SimResult(streams), step_ms=step_ms, ramp_s=ramp_s, duration_s=duration_s,
               async_steps=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", default="832,896,960,1024")
    p.add_argument("--fill", default="256", help="decode_fill_seqs values, comma-separated")
    p.add_argument("--horizon-s", default="1.0", help="decode_horizon_s values")
    p.add_argument("--prefill-wait-s", default="0.05", help="prefill_wait_s values")
    p.add_argument("--duration-s", type=float, default=15.0, help="streams are started (and replaced) this long, as DURATION_S")
    p.add_argument("--ramp-s", type=float, default=10.0, help="the first starts spread over this long")
    p.add_argument("--row-cost", default="1", help="a row's cost past the first, scaled (0.85: 15%% cheaper rows)")
    args = p.parse_args(argv)
    floats = lambda v: [float(x) for x in v.split(",")]  # noqa: E731
    print("Qwen3-TTS on a modelled H200, served steps at `e307713` (an estimate: benchmark/qwen3_sim.py's docstring)")
    print(" streams  fill horizon  wait row cost  TTFA p50   p90   p99  underran  rows/step  slowest step ms")
    for n in (int(x) for x in args.streams.split(",")):
        for fill in (int(x) for x in args.fill.split(",")):
            for horizon in floats(args.horizon_s):
                for wait in floats(args.prefill_wait_s):
                    for cost in floats(args.row_cost):
                        r = simulate(n, fill=fill, horizon_s=horizon, prefill_wait_s=wait, model=FrameSteps(row_cost=cost),
                                     duration_s=args.duration_s, ramp_s=args.ramp_s)
                        print(f"{n:8d} {fill:5d} {horizon:7.2f} {wait:5.2f} {cost:9.2f} {r.pct(0.5):9.0f} {r.pct(0.9):5.0f} "
                              f"{r.pct(0.99):5.0f} {r.underrun_streams:9d} {r.rows / max(r.steps, 1):10.0f} "
                              f"{r.max_step_ms:16.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
