"""SNAC decode cost per frame: window re-decode (``decode_requests``) vs stateful ``StreamingSnac``.

Full-width SNAC 24 kHz with random weights. Both sides decode one new frame for each of
``--batch`` streams per call, side by side in one run: the old path re-decodes a 6-frame
window per stream (``StreamingDecoder``'s ``WindowRequest``), the new one runs the frame once
through the per-slot state (``StreamingSnac.step``). Prints medians of ``--runs`` calls.

    python -m benchmark.codec_stream --batch 16 --runs 7 [--device cpu] [--dtype float32]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from models.orpheus.codec import DEFAULT_LOOKAHEAD_SAMPLES, DEFAULT_WINDOW_FRAMES, SnacDecoder, WindowRequest, decode_requests
from models.orpheus.loader import load_snac
from models.orpheus.snac_stream import OPEN_END_FRAMES, StreamingSnac
from models.orpheus.tokens import SAMPLES_PER_FRAME as F

__all__ = ["main"]


def _median_s(fn, runs: int, device: torch.device) -> float:
    times = []
    for _ in range(runs + 1):  # the first call warms up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = p.parse_args(argv)
    if args.batch < 1 or args.runs < 1:
        raise SystemExit("--batch and --runs must be >= 1")
    device = torch.device(args.device)
    torch.set_grad_enabled(False)
    dec = SnacDecoder(load_snac(load_format="dummy", seed=0, device=device))
    w, b = DEFAULT_WINDOW_FRAMES, args.batch
    g = torch.Generator().manual_seed(0)
    # Mid-stream windows as StreamingDecoder builds them: all W frames real, 2048 samples out.
    emit_to = w * F - DEFAULT_LOOKAHEAD_SAMPLES
    reqs = [WindowRequest(torch.randint(0, 4096, (w, 7), generator=g), 10 + i, 0, w, emit_to - F, emit_to)
            for i in range(b)]
    window_s = _median_s(lambda: decode_requests(dec, reqs), args.runs, device)

    snac = StreamingSnac(dec, max_streams=b, device=device, dtype=getattr(torch, args.dtype))
    slots = torch.arange(b, device=device)
    frames = torch.randint(0, 4096, (b, 7), generator=g).to(device)
    ends = torch.full((b,), OPEN_END_FRAMES, device=device)
    step_s = _median_s(lambda: snac.step(slots, frames, ends).cpu(), args.runs, device)

    print(f"machine: {platform.machine()} {platform.processor() or ''} torch {torch.__version__} "
          f"threads {torch.get_num_threads()} device {device}")
    print(f"full-width SNAC 24 kHz, random weights, batch {b}, median of {args.runs} calls")
    print(f"window re-decode (W={w}, fp32): {window_s * 1e3:8.1f} ms/call {window_s / b * 1e3:7.2f} ms/frame")
    print(f"StreamingSnac.step ({args.dtype}): {step_s * 1e3:8.1f} ms/call {step_s / b * 1e3:7.2f} ms/frame")
    print(f"ratio window / streaming: {window_s / step_s:.2f}x; state per stream "
          f"{snac.state_numel_per_stream * snac.state.element_size() / 1024:.0f} KiB; delay {snac.delay_samples} samples")


if __name__ == "__main__":
    main()
