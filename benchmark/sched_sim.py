"""The driver the scheduler models share (``light_steps_sim``, ``qwen3_sim``): the engine's own
``Scheduler`` on a simulated clock, fed streams as ``voxgate bench`` starts them and played as its
clients play them, each step costing what a model of the GPU says.

Streams start evenly over a ramp and, while the run lasts, each is replaced as its last audio
arrives; the engine core's deadlines are reproduced (first audio due ``first_audio_budget_s``
after a stream's start, then when its client's playback, started at the first audio, runs dry)
and a client underruns when a frame comes after its 100 ms buffer ran out. Steps run one after
the other, or asynchronously as ``LMBackend`` runs them on CUDA: a call schedules and launches
step k+1 while k runs, takes k's tokens when k ends, and k's audio leaves at the end of the next
call (its codec work runs beside k+1).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.llm.scheduler import ScheduledBatch, Scheduler
from engine.llm.sequence import SamplingParams, Sequence, SequenceStatus

__all__ = ["SimResult", "StreamShape", "run"]


@dataclass(frozen=True)
class StreamShape:
    """What a stream is to the scheduler: its prompt, the token whose frame is its first audio
    (the ones before make none), and its frames of audio."""

    prompt_tokens: int
    first_audio_token: int
    audio_frames: int
    frame_s: float = 0.08
    first_audio_budget_s: float = 0.15  # CoreConfig.first_audio_budget_s
    start_buffer_s: float = 0.1  # the client's buffer before it plays (voxgate bench)


@dataclass
class SimResult:
    streams: int
    light_steps: int = 0
    ttfa_ms: list[float] = field(default_factory=list)
    underrun_streams: int = 0
    steps: int = 0
    light: int = 0  # light steps (docs/scheduling.md, "Light steps")
    rows: int = 0  # decode rows over all steps
    max_step_ms: float = 0.0

    def pct(self, q: float) -> float:
        xs = sorted(self.ttfa_ms)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else math.nan


@dataclass
class _Stream:
    start: float
    first_audio: float = math.nan
    frames: int = 0
    underruns: int = 0


def run(sched: Scheduler, now: list[float], shape: StreamShape, result: SimResult, *,
        step_ms: Callable[[ScheduledBatch], float], ramp_s: float, duration_s: float,
        async_steps: bool) -> SimResult:
    """Drive ``sched`` (its clock reads ``now[0]``) for ``result.streams`` streams of ``shape``;
    ``step_ms(batch)``: a step's milliseconds, asked as it is launched, after
    ``Scheduler.advance`` (its rows count the token it makes)."""
    n = result.streams
    arrivals = [ramp_s * i / n for i in range(n)]
    live: dict[int, _Stream] = {}
    next_id = 0

    def start(t: float) -> None:
        nonlocal next_id
        seq = Sequence(next_id, [1] * shape.prompt_tokens,
                       SamplingParams(max_tokens=shape.first_audio_token + shape.audio_frames))
        sched.add(seq)
        sched.set_deadline(seq.seq_id, t + shape.first_audio_budget_s, first_audio=True)
        live[seq.seq_id] = _Stream(t)
        next_id += 1

    def deliver(seq: Sequence, k: int) -> None:  # token k's frame reaches the engine core
        st = live[seq.seq_id]
        if k >= shape.first_audio_token:
            if st.frames == 0:
                st.first_audio = now[0]
                result.ttfa_ms.append(1e3 * (now[0] - st.start))
            elif now[0] > st.first_audio + shape.start_buffer_s + shape.frame_s * st.frames:
                st.underruns += 1  # the client's buffer ran dry before this frame came
            st.frames += 1
            sched.set_deadline(seq.seq_id, st.first_audio + shape.frame_s * st.frames)
        if k + 1 >= seq.params.max_tokens:
            result.underrun_streams += st.underruns > 0
            del live[seq.seq_id]
            if now[0] < duration_s:
                start(now[0])

    def count(batch: ScheduledBatch, ms: float) -> None:
        result.steps += 1
        result.light += batch.is_light
        result.rows += batch.num_decode_seqs
        result.max_step_ms = max(result.max_step_ms, ms)

    gpu_free = 0.0
    inflight: tuple[ScheduledBatch, float] | None = None  # launched, its tokens not yet taken
    leaving: list[tuple[Sequence, int]] = []  # rows (and token index) whose audio leaves this call
    while arrivals or live:
        while arrivals and arrivals[0] <= now[0]:
            start(arrivals.pop(0))
        batch = sched.schedule()
        if not async_steps:
            if batch is None:
                if not arrivals:
                    break
                now[0] = arrivals[0]
                continue
            sched.advance(batch)  # then fill: Scheduler.update, split so step_ms sees what async steps see
            ms = step_ms(batch)
            now[0] += ms / 1e3
            count(batch, ms)
            for seq, _ in sched.fill(batch, [0] * batch.num_seqs):
                k = len(seq.output_ids) - 1
                if k + 1 >= seq.params.max_tokens:
                    sched.finish(seq)
                deliver(seq, k)
            continue
        if batch is not None:
            sched.advance(batch)
            ms = step_ms(batch)
            gpu_free = max(now[0], gpu_free) + ms / 1e3
            count(batch, ms)
        taken: list[tuple[Sequence, int]] = []
        if inflight is not None:
            prev, end = inflight
            now[0] = max(now[0], end)  # wait for its tokens
            sched.fill(prev, [0] * prev.num_seqs)
            for seq, index in zip(prev.seqs, prev.output_index):
                if index < 0 or seq.status is not SequenceStatus.RUNNING:  # as LMBackend._take_tokens
                    continue
                taken.append((seq, index))
                if index + 1 >= seq.params.max_tokens:
                    sched.finish(seq)
        for seq, k in leaving:
            deliver(seq, k)
        leaving = taken
        inflight = (batch, gpu_free) if batch is not None else None
        if batch is None and inflight is None and not leaving:
            if not arrivals:
                if live:
                    raise RuntimeError("streams left with no work scheduled")
                break
            now[0] = max(now[0], arrivals[0])
    return result
