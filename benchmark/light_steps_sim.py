"""Light steps replayed on a modelled GPU: the engine's own ``Scheduler`` driven by a simulated
clock, with Kyutai TTS's step times as the parts measured on an H200 give them, for streams
started over a ramp, with and without light steps (docs/scheduling.md, "Light steps").

    python -m benchmark.light_steps_sim [--streams 128,256,400] [--light 0,4,8]

An estimate, not a measurement: step times are a model (``KyutaiSteps``: the parts of
docs/performance.md at 1, 128 and 256 rows, linear between, plus host work fitted to two
served figures), the engine core's deadlines are reproduced (first audio due 0.15 s after a
stream's start, then when its client's playback runs dry) and the client plays from its first
audio with a 100 ms buffer, as ``voxgate bench`` counts it. ``--async-steps`` runs the steps as
``LMBackend`` does on CUDA (a step's audio leaves one call later); prompts' own cost and the
codec's separate stream are not modelled. Use it to choose what to measure.

    python -m benchmark.light_steps_sim --parts e307713 --async-steps --light-slack-s 0.1,0.05,0.02 --light-rows 16,32
"""

from __future__ import annotations

import argparse
import bisect
import itertools
from dataclasses import dataclass

from benchmark.sched_sim import SimResult, StreamShape, run
from engine.llm.page_allocator import PageAllocator
from engine.llm.scheduler import LIGHT_SLACK_S, ScheduledBatch, Scheduler, SchedulerConfig

__all__ = ["KyutaiSteps", "SimResult", "main", "simulate"]

FRAME_S = 0.08  # Kyutai's frame: 12.5 a second
FIRST_AUDIO_STEP = 20  # the token whose frame is the first audio (21 steps)
LIGHT_UNTIL = 18  # steps 0..17 run the head's cheaper variants
AUDIO_FRAMES = 145  # 10 s streams after the delay, as [KY]


def _interp(rows: int, points: tuple[tuple[int, float], ...]) -> float:
    xs = [p[0] for p in points]
    i = min(max(bisect.bisect_left(xs, rows), 1), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (rows - x0) / (x1 - x0)


@dataclass(frozen=True)
class KyutaiSteps:
    """Step milliseconds by decode rows: the parts on 158d7881 at `45808a2` (kyutai_parts), and
    host work fitted to the served steps (28 rows in 12.3 ms at 128 streams, 71 in 16.8 at 400)."""

    backbone: tuple[tuple[int, float], ...] = ((1, 1.93), (128, 4.99), (256, 5.85))
    head: tuple[tuple[int, float], ...] = ((1, 6.59), (128, 7.56), (256, 9.76))
    mimi: tuple[tuple[int, float], ...] = ((1, 1.38), (128, 3.53), (256, 5.59))
    head_light: tuple[tuple[int, float], ...] = ((1, 0.75), (16, 0.8), (256, 1.3))  # text only / codebook 0
    host_ms: float = 0.8
    host_ms_per_row: float = 0.035

    def full_ms(self, rows: int) -> float:
        return (_interp(rows, self.backbone) + _interp(rows, self.head) + _interp(rows, self.mimi)
                + self.host_ms + self.host_ms_per_row * rows)

    def light_ms(self, rows: int) -> float:
        return _interp(rows, self.backbone) + _interp(rows, self.head_light) + self.host_ms + self.host_ms_per_row * rows


# The parts by commit (kyutai_parts on an H200): the default model above (158d7881 at `45808a2`),
# and with the four Triton kernels (743e4974 at `e307713`: the depth attention, the voice
# cross-attention and the top-k draw; the light variants from its text-only and codebook-0 heads).
PARTS = {
    "45808a2": KyutaiSteps(),
    "e307713": KyutaiSteps(backbone=((1, 1.96), (128, 3.25), (256, 4.14)), head=((1, 5.92), (128, 5.95), (256, 6.96)),
                           mimi=((1, 1.31), (128, 3.43), (256, 5.55)), head_light=((1, 0.68), (128, 0.72), (256, 0.85))),
}


def simulate(streams: int, light_steps: int, *, ramp_s: float = 10.0, duration_s: float = 15.0,
             model: KyutaiSteps | None = None, fill: int = 32, start_buffer_s: float = 0.1,
             light_until: int = LIGHT_UNTIL, async_steps: bool = False, light_slack_s: float = LIGHT_SLACK_S,
             light_rows: int = 16) -> SimResult:
    """Streams started evenly over ``ramp_s`` and, while ``duration_s`` lasts, each replaced as
    it ends (``voxgate bench``'s concurrency mode); every stream's TTFA and underruns
    (``benchmark.sched_sim``). ``light_until`` above the variants' 18 steps: a turn's whole
    steps before its first audio go in steps of their own too (a step with such a row costs a
    whole frame's head). ``async_steps``: steps as ``LMBackend`` runs them on CUDA (a step's
    audio leaves one call later); without, a step's audio leaves as it ends."""
    model = model or KyutaiSteps()
    now = [0.0]
    cfg = SchedulerConfig(max_num_seqs=2048, max_num_batched_tokens=4096, max_model_len=512, max_waiting=4096,
                          decode_horizon_s=1.0, decode_fill_seqs=fill, light_steps_max=light_steps,
                          light_until_step=light_until if light_steps else 0, light_slack_s=light_slack_s,
                          light_max_rows=light_rows)
    sched = Scheduler(cfg, PageAllocator(2048 * 12 + 1, 16), clock=lambda: now[0])

    def step_ms(batch: ScheduledBatch) -> float:
        rows = batch.num_decode_seqs  # (advanced: a row's token in this step is counted)
        cheap = batch.is_light and all(s.num_output_tokens <= LIGHT_UNTIL for s in batch.seqs[:rows])
        return model.light_ms(rows) if cheap else model.full_ms(max(rows, 1))

    shape = StreamShape(prompt_tokens=1, first_audio_token=FIRST_AUDIO_STEP, audio_frames=AUDIO_FRAMES,
                        frame_s=FRAME_S, start_buffer_s=start_buffer_s)
    return run(sched, now, shape, SimResult(streams, light_steps), step_ms=step_ms, ramp_s=ramp_s,
               duration_s=duration_s, async_steps=async_steps)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", default="128,256,400")
    p.add_argument("--light", default="0,4,8", help="light_steps_max values (0: off)")
    p.add_argument("--fill", default="32", help="decode_fill_seqs values, comma-separated")
    p.add_argument("--parts", default="45808a2", choices=sorted(PARTS), help="the step model: parts measured at that commit")
    p.add_argument("--light-slack-s", default=str(LIGHT_SLACK_S), help="light_slack_s values, comma-separated (--light-slack-s)")
    p.add_argument("--light-rows", default="16",
                   help="light_max_rows values, comma-separated (the rows the head's light variants are captured for)")
    p.add_argument("--async-steps", action="store_true",
                   help="steps asynchronous as LMBackend runs them on CUDA (a step's audio leaves one call later)")
    args = p.parse_args(argv)
    print(f"Kyutai TTS on a modelled H200, parts at `{args.parts}`{', steps asynchronous' if args.async_steps else ''} "
          "(an estimate: benchmark/light_steps_sim.py's docstring)")
    print(" streams  fill light slack  rows  TTFA p50   p90   p99  underran  steps  light share")
    for n in (int(x) for x in args.streams.split(",")):
        for fill in (int(x) for x in args.fill.split(",")):
            for light in (int(x) for x in args.light.split(",")):
                for slack, rows in itertools.product((float(x) for x in args.light_slack_s.split(",")),
                                                     [int(x) for x in args.light_rows.split(",")]):
                    r = simulate(n, light, fill=fill, model=PARTS[args.parts], async_steps=args.async_steps,
                                 light_slack_s=slack, light_rows=rows)
                    print(f"{n:8d} {fill:5d} {light:5d} {slack:5.2f} {rows:5d} {r.pct(0.5):9.0f} {r.pct(0.9):5.0f} "
                          f"{r.pct(0.99):5.0f} {r.underrun_streams:9d} {r.steps:6d} {r.light / max(r.steps, 1):12.2f}",
                          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
