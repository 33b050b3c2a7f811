"""The host's work per decode row of a frame model's step, from the runner's tokens to the bytes
the engine loop writes, with the device's part left out: what a step of B rows costs the
engine's one thread beside the GPU (docs/performance.md, "On the CPU").

    python -m benchmark.host_rows [--rows 256,873] [--repeat 30]

Each part runs on its own over B rows of one 1,920-sample frame (Qwen3-TTS: 80 ms at 24 kHz)
and 16 codes: the frame codes to the codec's input tensor (``SlotCodec.launch``'s host half),
the codec's output rows to numpy (its collect), ``LMBackend._outputs`` (rows to ``JobOutput``),
``EngineCore.step`` over those outputs (stream bookkeeping, deadlines, PCM encoding) with a
backend that only returns them, and the loop's message encoding (``engine.messages``). Then,
with ``--program`` (default ``qwen3-tts-tiny``; ``tiny`` is Orpheus; ``kyutai-tts-tiny`` with its
state machine run on the CPU as the device would, its time left out), a whole ``LMBackend.step``
of that program with the device's part stubbed (the runner returns its tokens at once, the codec
its samples): the
scheduler, the tokens' bookkeeping, the program's inputs and outputs (``lm_backend``; it
includes ``codec_in``, ``codec_out`` and ``outputs``, so it is not added to ``total``; ``all`` is
it with ``core_step`` and ``encode`` for each output a row makes: the step's host work from the
runner's tokens out). Medians of ``--repeat`` runs (``lm_backend``: the mean over whole
seven-step cycles), microseconds a row; CPU only, no GPU needed.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from typing import Any, Callable

import numpy as np
import torch

from benchmark.args import list_type, number_type
from engine import messages as m
from engine.backend import BackendInfo, JobOutput
from engine.core import EngineCore
from engine.llm.backend import LMBackend, _Inflight, _Taken
from engine.llm.sequence import SamplingParams, Sequence
from engine.llm.slot_codec import SlotCodec

__all__ = ["main", "measure"]

FRAME_SAMPLES = 1920
NUM_CODES = 16


class _ReturnsOutputs:
    """A backend whose step returns a fixed list of outputs (one job per stream)."""

    def __init__(self, outputs: list[JobOutput]) -> None:
        self.info = BackendInfo("host-rows", ("a",), "a", 24000, input_streaming=True, tokens_per_audio_second=12.5)
        self._outputs = outputs
        self.jobs: list[int] = []
        self.deadlines = 0

    def validate(self, voice: Any, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return "a", {}

    def add_job(self, job_id: int, text: str, voice: str, options: dict[str, Any]) -> None:
        self.jobs.append(job_id)

    def push_text(self, job_id: int, text: str, flush: bool = False) -> None:
        pass

    def set_deadline(self, job_id: int, deadline_s: float, first_audio: bool = False) -> None:
        self.deadlines += 1

    def cancel_job(self, job_id: int) -> None:
        pass

    def has_work(self) -> bool:
        return True

    def num_queued(self) -> int:
        return 0

    def step(self) -> list[JobOutput]:
        return [JobOutput(o.job_id, o.pcm) for o in self._outputs]


class _NoCodec:
    """A codec stream whose step costs nothing: ``SlotCodec``'s host work alone."""

    scratch_slot = 0

    def __init__(self, rows: int) -> None:
        self._out = torch.zeros(rows, FRAME_SAMPLES)

    def reset(self, slots: torch.Tensor) -> None:
        pass

    def step(self, slots: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        return self._out[: slots.shape[0]]


def _median_us(fn: Callable[[], Any], repeat: int, rows: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / rows * 1e6


def measure(rows: int, repeat: int = 30, program: str | None = None) -> dict[str, float]:
    """Microseconds a row of each part at ``rows`` rows (module docstring); ``program``: also
    ``lm_backend``, a whole ``LMBackend.step`` of that program with the device stubbed."""
    rng = np.random.default_rng(0)
    frame = (rng.standard_normal(FRAME_SAMPLES) * 0.1).astype(np.float32)
    codes = rng.integers(0, 2048, (rows, NUM_CODES)).tolist()
    codec = SlotCodec(_NoCodec(rows), num_codes=NUM_CODES, device="cpu")
    out: dict[str, float] = {}
    out["codec_in"] = _median_us(lambda: codec.launch(list(range(rows)), codes), repeat, rows)
    collect = codec.launch(list(range(rows)), codes)
    out["codec_out"] = _median_us(collect, repeat, rows)

    seqs = [Sequence(i, [1], SamplingParams(max_tokens=1000)) for i in range(rows)]
    pcms = [frame.copy() for _ in range(rows)]
    taken = _Taken(new=[(s, c) for s, c in zip(seqs, codes)], live=[(s, c) for s, c in zip(seqs, codes)], ended=[])
    work = _Inflight(taken, lambda: pcms, lambda: [])
    backend = LMBackend.__new__(LMBackend)  # _outputs reads only its argument
    out["outputs"] = _median_us(lambda: backend._outputs(work), repeat, rows)

    fake = _ReturnsOutputs([JobOutput(i + 1, p) for i, p in enumerate(pcms)])
    core = EngineCore(fake)
    for key in range(rows):
        core.open(key, None, {}, "pcm_s16le", None)
        core.add_text(key, "Hello there, this is a sentence long enough to make a job. ")
    if len(fake.jobs) != rows or fake.jobs[0] != 1:
        raise RuntimeError(f"expected job ids 1..{rows}, got {fake.jobs[:3]}... ({len(fake.jobs)})")
    messages: list[m.Message] = []

    def core_step() -> None:
        messages[:] = core.step()

    out["core_step"] = _median_us(core_step, repeat, rows)
    if len(messages) != rows:
        raise RuntimeError(f"the core made {len(messages)} messages for {rows} rows")
    out["encode"] = _median_us(lambda: m.encode(m.Batch(messages)), repeat, rows)
    out["total"] = sum(out.values())
    if program:
        out["lm_backend"], out["outputs_a_row"] = _lm_backend_us(program, rows, repeat)
        # the step's host work end to end: the core and the encoding work per output (a chunk)
        out["all"] = out["lm_backend"] + out["outputs_a_row"] * (out["core_step"] + out["encode"])
    return out


def _lm_backend_us(program: str, rows: int, repeat: int) -> tuple[float, float]:
    """``LMBackend.step`` of ``program`` (a tiny one: --load-format dummy on the CPU) at ``rows``
    decode rows, asynchronous steps, with the runner and the codec stubbed: a frame program
    (Qwen3-TTS and the others with a ``SlotCodec``) gets frames of codes, Orpheus (``tiny``)
    audio tokens valid at each row's position (a frame completes every seventh). Microseconds a
    row, and the outputs a row (1 for a frame program, about 1/7 for Orpheus)."""
    from engine.llm.build import build_lm_backend
    from engine.llm.model_runner import LaunchedStep
    from models.registry import load_factory, resolve

    resolved = resolve(program)
    backend = build_lm_backend(load_factory(resolved.entry), resolved.model_id, device="cpu", load_format="dummy",
                               max_model_len=2048, max_waiting=rows + 8, max_num_seqs=rows + 1, async_steps="on",
                               warmup=False)
    voice, options = backend.validate(None, {"max_tokens": 4000, "seed": 1})
    streaming = bool(backend.info.input_streaming)
    text = "Hello there, this is a test of the engine on a long enough sentence to keep it busy for a while."
    for job in range(rows):
        backend.add_job(job, text * (3 if streaming else 1), voice, options)
        if streaming:
            backend.push_text(job, "", final=True)
    for _ in range(3):  # the prompts, on the tiny model
        backend.step()
    prog = backend.program
    if getattr(prog, "stream_codec", None) is not None:  # Orpheus: SNAC's stateful step
        from models.orpheus.tokens import AUDIO_BASE, CODEBOOK_SIZE, SAMPLES_PER_FRAME

        snac = prog.stream_codec
        zeros = torch.zeros(rows + 8, SAMPLES_PER_FRAME)
        snac.step = lambda slots, codes, end: zeros[: slots.shape[0]]
        snac.reset = lambda fresh: None
        prog.decode_fn = lambda requests: [np.zeros(SAMPLES_PER_FRAME, np.float32) for _ in requests]  # the ramp's windows

        def tokens_for(batch: Any) -> torch.Tensor:
            return torch.tensor([AUDIO_BASE + CODEBOOK_SIZE * s.allowed_row + 5 for s in batch.seqs], dtype=torch.int64)
        feed_of = lambda tokens: tokens  # noqa: E731
    else:
        codec = prog.codec.stream
        zeros = torch.zeros(rows + 8, FRAME_SAMPLES)
        codec.step = lambda slots, codes: zeros[: slots.shape[0]]
        codec.reset = lambda slots: None

        def tokens_for(batch: Any) -> torch.Tensor:
            return torch.full((batch.num_seqs, NUM_CODES), 5, dtype=torch.int64)  # no stop code
        feed_of = lambda tokens: tokens[:, 0]  # noqa: E731
    machine = getattr(prog, "machine", None)
    if machine is not None:  # Kyutai: the device's state machine feeds the text back (the host checks it)
        from models.kyutai_tts.machine import NEW_WORD

        width = 2 + prog.n_q

        def tokens_for(batch: Any) -> torch.Tensor:  # every row asks for its next word when it may
            b = batch.num_seqs
            slots = torch.tensor([s.slot for s in batch.seqs], dtype=torch.int64)
            sampled = torch.full((b,), NEW_WORD, dtype=torch.int64)
            tokens = torch.full((b, width), 5, dtype=torch.int64)
            tokens[:, 0] = sampled
            tokens[:, 1] = machine.step(slots, sampled, torch.zeros(b, dtype=torch.int64), torch.ones(b, dtype=torch.bool))
            return tokens
    stub_s = 0.0  # the stub's own time (on the device when served): left out of the figure

    def launch(batch: Any, feed: Any = None) -> LaunchedStep:
        nonlocal stub_s
        t0 = time.perf_counter()
        tokens = tokens_for(batch)
        stub_s += time.perf_counter() - t0
        return LaunchedStep(lambda: tokens.tolist(), feed_of(tokens))

    backend.runner.launch = launch
    for _ in range(40):  # past Orpheus's window-decoder ramp (a segment's first four frames)
        backend.step()
    if backend.scheduler.num_running != rows:
        raise RuntimeError(f"{backend.scheduler.num_running} rows running, not {rows}")
    # the mean over whole seven-step cycles: Orpheus's rows, started together, complete their
    # frames on the same step (served, they start apart); a median would be a step without
    steps = 7 * -(-repeat // 7)
    outputs = 0
    stub_s = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        outputs += len(backend.step())
    return (time.perf_counter() - t0 - stub_s) / steps / rows * 1e6, outputs / steps / rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=list_type(number_type(int, 1)), default=[256, 873])
    p.add_argument("--repeat", type=number_type(int, 3), default=30)
    p.add_argument("--program", default="qwen3-tts-tiny", help="lm_backend's program ('none': skip it)")
    args = p.parse_args(argv)
    program = None if args.program == "none" else args.program
    print(f"host work per row on {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"torch {torch.__version__} (us a row, medians of {args.repeat})")
    names = ("codec_in", "codec_out", "outputs", "core_step", "encode", "total")
    extra = ("lm_backend", "outputs_a_row", "all") if program else ()
    print(f"{'rows':>6} " + " ".join(f"{n:>10}" for n in names) + "   ms a step" + "".join(f" {n:>13}" for n in extra))
    for rows in args.rows:
        r = measure(rows, args.repeat, program)
        print(f"{rows:6d} " + " ".join(f"{r[n]:10.2f}" for n in names) + f"   {r['total'] * rows / 1e3:8.2f}"
              + "".join(f" {r[n]:13.2f}" for n in extra), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
