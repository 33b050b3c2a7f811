"""The host's work per decode row of a frame model's step, from the runner's tokens to the bytes
the engine loop writes, with the device's part left out: what a step of B rows costs the
engine's one thread beside the GPU (docs/performance.md, "The host's work per row").

    python -m benchmark.host_rows [--rows 256,873] [--repeat 30]

Each part runs on its own over B rows of one 1,920-sample frame (Qwen3-TTS: 80 ms at 24 kHz)
and 16 codes: the frame codes to the codec's input tensor (``SlotCodec.launch``'s host half),
the codec's output rows to numpy (its collect), ``LMBackend._outputs`` (rows to ``JobOutput``),
``EngineCore.step`` over those outputs (stream bookkeeping, deadlines, PCM encoding) with a
backend that only returns them, and the loop's message encoding (``engine.messages``). Medians
of ``--repeat`` runs, microseconds a row; CPU only, no GPU needed.
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


def measure(rows: int, repeat: int = 30) -> dict[str, float]:
    """Microseconds a row of each part at ``rows`` rows (module docstring)."""
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
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=list_type(number_type(int, 1)), default=[256, 873])
    p.add_argument("--repeat", type=number_type(int, 3), default=30)
    args = p.parse_args(argv)
    print(f"host work per row on {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"torch {torch.__version__} (us a row, medians of {args.repeat})")
    names = ("codec_in", "codec_out", "outputs", "core_step", "encode", "total")
    print(f"{'rows':>6} " + " ".join(f"{n:>10}" for n in names) + "   ms a step")
    for rows in args.rows:
        r = measure(rows, args.repeat)
        print(f"{rows:6d} " + " ".join(f"{r[n]:10.2f}" for n in names) + f"   {r['total'] * rows / 1e3:8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
