"""SNAC decode cost per frame: window re-decode (``decode_requests``) vs stateful ``StreamingSnac``.

Full-width SNAC 24 kHz with random weights. Both sides decode one new frame for each of
``--batch`` streams per call, side by side in one run: the old path re-decodes a 6-frame
window per stream (``StreamingDecoder``'s ``WindowRequest``), the new one runs the frame once
through the per-slot state (``StreamingSnac.step``). Prints medians of ``--runs`` calls.

    python -m benchmark.codec_stream --batch 16 --runs 7 [--device cpu] [--dtype float32]
    python -m benchmark.codec_stream --device cuda --graphs --batch 256 --runs 50 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from models.orpheus.codec import (
    DEFAULT_LOOKAHEAD_SAMPLES, DEFAULT_WINDOW_FRAMES, SnacDecoder, WindowRequest, decode_requests,
)
from models.orpheus.loader import load_snac
from models.orpheus.snac_stream import OPEN_END_FRAMES, StreamingSnac
from models.orpheus.tokens import SAMPLES_PER_FRAME as F

__all__ = ["main"]


def _timed(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--graphs", action="store_true",
                   help="CUDA only: both sides replayed from CUDA graphs (codec_graphs / codec_stream_graphs)")
    args = p.parse_args(argv)
    if args.batch < 1 or args.runs < 1:
        raise SystemExit("--batch and --runs must be >= 1")
    device = torch.device(args.device)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    dec = SnacDecoder(load_snac(load_format="dummy", seed=0, device=device))
    w, b = DEFAULT_WINDOW_FRAMES, args.batch
    g = torch.Generator().manual_seed(0)
    # Mid-stream windows as StreamingDecoder builds them: all W frames real, 2048 samples out.
    emit_to = w * F - DEFAULT_LOOKAHEAD_SAMPLES
    reqs = [WindowRequest(torch.randint(0, 4096, (w, 7), generator=g), 10 + i, 0, w, emit_to - F, emit_to)
            for i in range(b)]
    snac = StreamingSnac(dec, max_streams=b, device=device, dtype=getattr(torch, args.dtype))
    slots = torch.arange(b, device=device)
    frames = torch.randint(0, 4096, (b, 7), generator=g).to(device)
    ends = torch.full((b,), OPEN_END_FRAMES, device=device)

    def window() -> None:
        decode_requests(dec, reqs)

    def stream() -> None:
        snac.step(slots, frames, ends).cpu()

    if args.graphs:
        if device.type != "cuda":
            raise SystemExit("--graphs needs --device cuda")
        from engine.llm.codec_graphs import make_graph_decode_fn
        from engine.llm.codec_stream_graphs import StreamingCodecGraphs

        window_fn = make_graph_decode_fn(dec, buckets=(b,), progress=False)
        codec = StreamingCodecGraphs(snac, buckets=(b,), progress=False)

        def window() -> None:  # noqa: F811 - the graphed variants replace the eager ones
            window_fn(reqs)

        def stream() -> None:  # noqa: F811
            codec.step(slots, frames, ends).cpu()

    window(), stream()  # warm-up
    # Interleaved, so that a shared machine's load drifts over both sides alike.
    pairs = [(_timed(window, device), _timed(stream, device)) for _ in range(args.runs)]
    window_s = statistics.median(p[0] for p in pairs)
    step_s = statistics.median(p[1] for p in pairs)
    ratio = statistics.median(p[0] / p[1] for p in pairs)

    print(f"machine: {platform.machine()} {platform.processor() or ''} torch {torch.__version__} "
          f"threads {torch.get_num_threads()} device {device}")
    print(f"full-width SNAC 24 kHz, random weights, batch {b}, median of {args.runs} calls")
    how = "CUDA graphs" if args.graphs else "eager"
    print(f"window re-decode (W={w}, fp32, {how}): {window_s * 1e3:8.1f} ms/call {window_s / b * 1e3:7.2f} ms/frame")
    print(f"StreamingSnac.step ({args.dtype}, {how}): {step_s * 1e3:8.1f} ms/call {step_s / b * 1e3:7.2f} ms/frame")
    print(f"ratio window / streaming (median of per-run ratios): {ratio:.2f}x; state per stream "
          f"{snac.state_numel_per_stream * snac.state.element_size() / 1024:.0f} KiB; "
          f"delay {snac.delay_samples} samples")


if __name__ == "__main__":
    main()
