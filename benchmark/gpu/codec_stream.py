"""SNAC decode cost per frame on the GPU or CPU: the window re-decode against the stateful
``StreamingSnac``, or (``--compare``) the stateful step's implementations (benchmark/gpu/README.md).

    python -m benchmark.gpu.codec_stream --device cuda --graphs --batch 256 --runs 50 --dtype bfloat16"""

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

PATHS = ("ncw", "nwc", "compiled")


def _timed(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--graphs", action="store_true",
                   help="CUDA only: both sides replayed from CUDA graphs (codec_graphs / codec_stream_graphs)")
    p.add_argument("--compare", action="store_true",
                   help="time StreamingSnac.step paths side by side (--paths, --batches, --dtypes)")
    p.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    p.add_argument("--batches", nargs="+", type=int, default=[16, 64, 128])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=("float32", "bfloat16"))
    p.add_argument("--count-kernels", action="store_true",
                   help="CUDA only, with --compare: GPU kernels (and memcpy/memset) of one step per path (profiler)")
    p.add_argument("--tf32", action="store_true",
                   help="allow TF32 in cuBLAS matmuls too (cuDNN convolutions allow it by default)")
    args = p.parse_args(argv)
    if args.batch < 1 or args.runs < 1 or min(args.batches) < 1:
        raise SystemExit("--batch, --batches and --runs must be >= 1")
    device = torch.device(args.device)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.graphs and device.type != "cuda":
        raise SystemExit("--graphs needs --device cuda")
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
    torch.set_grad_enabled(False)
    dec = SnacDecoder(load_snac(load_format="dummy", seed=0, device=device))
    if args.compare:
        with torch.inference_mode():  # as BatchGraphs captures: one grad mode, no recompile
            _compare(dec, args, device)
        return
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

    if args.graphs:
        from models.orpheus.codec_graphs import make_graph_decode_fn
        from models.orpheus.codec_stream_graphs import StreamingCodecGraphs

        window_fn = make_graph_decode_fn(dec, buckets=(b,), progress=False)
        step_fn = StreamingCodecGraphs(snac, buckets=(b,), progress=False).step
    else:
        def window_fn(requests):  # noqa: ANN001, ANN202
            return decode_requests(dec, requests)

        step_fn = snac.step

    def window() -> None:
        window_fn(reqs)

    def stream() -> None:
        step_fn(slots, frames, ends).cpu()

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


def _compare(dec: SnacDecoder, args: argparse.Namespace, device: torch.device) -> None:
    """StreamingSnac.step per path, batch and dtype; calls of all paths interleaved per batch."""
    batches = sorted(set(args.batches))
    g = torch.Generator().manual_seed(0)
    print(f"machine: {platform.machine()} {platform.processor() or ''} torch {torch.__version__} "
          f"threads {torch.get_num_threads()} device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
    print(f"TF32: cudnn {torch.backends.cudnn.allow_tf32}, cuBLAS matmul {torch.backends.cuda.matmul.allow_tf32}; "
          f"{'CUDA graphs' if args.graphs else 'eager'}; median of {args.runs} calls; ms per call (all rows)")
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        steps, snacs = {}, {}
        for path in args.paths:
            t = time.perf_counter()
            snac = StreamingSnac(dec, max_streams=max(batches), device=device, dtype=dtype,
                                 channels_last=path != "ncw", compile=path == "compiled")
            snacs[path] = snac
            if args.graphs:
                from models.orpheus.codec_stream_graphs import StreamingCodecGraphs

                steps[path] = StreamingCodecGraphs(snac, buckets=batches, progress=False).step
            else:
                steps[path] = snac.step
                steps[path](*_rows(batches[-1], device, g))  # warm-up (compiles)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            print(f"  {dtype_name} {path}: built{' and captured' if args.graphs else ''} in "
                  f"{time.perf_counter() - t:.1f} s", flush=True)
        if args.count_kernels and device.type == "cuda":
            rows = _rows(batches[-1], device, g)
            print(f"  GPU kernels per step (batch {batches[-1]}): "
                  + ", ".join(f"{p} {_count_kernels(s, rows, device)}" for p, s in snacs.items()))
        print(f"{dtype_name:>9} {'batch':>5} " + " ".join(f"{p:>9}" for p in args.paths)
              + ("   " + " ".join(f"ncw/{p}" for p in args.paths if p != "ncw") if "ncw" in args.paths else ""))
        for b in batches:
            rows = _rows(b, device, g)
            for step in steps.values():
                step(*rows)  # warm-up at this size
            times = {p: [] for p in args.paths}
            for _ in range(args.runs):  # interleaved: a shared machine's drift hits every path alike
                for p, step in steps.items():
                    times[p].append(_timed(lambda: step(*rows).cpu(), device))
            med = {p: statistics.median(v) for p, v in times.items()}
            line = f"{'':>9} {b:>5} " + " ".join(f"{med[p] * 1e3:9.2f}" for p in args.paths)
            if "ncw" in args.paths:
                line += "   " + " ".join(f"{med['ncw'] / med[p]:{len(p) + 4}.2f}x" for p in args.paths if p != "ncw")
            print(line, flush=True)


def _count_kernels(snac: StreamingSnac, rows: tuple[torch.Tensor, ...], device: torch.device) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        snac.step(*rows)
        torch.cuda.synchronize(device)
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def _rows(b: int, device: torch.device, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """b open streams on slots 0..b-1 with random codes: (slots [b], frames [b, 7], ends [b])."""
    frames = torch.randint(0, 4096, (b, 7), generator=g).to(device)
    return torch.arange(b, device=device), frames, torch.full((b,), OPEN_END_FRAMES, device=device)


if __name__ == "__main__":
    main()
