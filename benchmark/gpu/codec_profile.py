"""Where a streaming codec step's GPU time goes: Qwen3-TTS's codec alone in each step layout
(channels-first ``CodecStream``, channels-last ``CodecStreamNWC``, the latter with its SnakeBeta
compiled, or its dense convolutions cuDNN's: ``--model-setting codec_layout``, ``codec_compile``,
``codec_conv``), side by side: their audio against each other over a few frames, each timed in a
CUDA graph with cuDNN's algorithm search off and on, then its kernels under ``torch.profiler``
(top by time; ``--top 0``: none).

    python -m benchmark.gpu.codec_profile --batch 512 [--layout ncw,nwc,nwc-cudnn+compile] [--dtype bfloat16] [--top 25]
    python -m benchmark.gpu.codec_profile --batch 512,1024 --layout nwc-triton+compile,nwc-triton+compile+ring

GPU only; random weights (``--load-format dummy``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from benchmark.gpu.graph_timing import graph_median_ms

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-tts-1.7b-customvoice", help="a preset of models.qwen3_tts.config")
    p.add_argument("--batch", default="512", help="rows, comma-separated")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--layout", default="ncw,nwc,nwc+compile,nwc-cudnn+compile",
                   help="step layouts, comma-separated: LAYOUT[-CONV][+compile][+ring] (codec_layout, "
                        "codec_conv, codec_compile on, codec_attention=triton)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--top", type=int, default=25, help="kernels listed")
    args = p.parse_args(argv)
    import torch

    from models.qwen3_tts.codec_nwc import make_codec_stream
    from models.qwen3_tts.loader import load_qwen3_tts

    if not torch.cuda.is_available():
        print("codec_profile needs a CUDA GPU", file=sys.stderr)
        return 2
    dev, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    batches = [int(x) for x in args.batch.split(",")]
    layouts = args.layout.split(",")
    loaded = load_qwen3_tts(args.model, device=dev, dtype=torch.bfloat16, codec_dtype=dtype, load_format="dummy")
    def build(spec: str) -> Any:  # "nwc-cudnn+compile+ring": layout, dense convolutions' kind, flags
        base, *flags = spec.split("+")
        if set(flags) - {"compile", "ring"}:
            raise SystemExit(f"codec_profile: unknown flags in {spec!r} (compile, ring)")
        layout, _, conv = base.partition("-")
        stream = make_codec_stream(loaded.codec, max(batches), layout=layout, conv=conv or None,
                                   compile="compile" in flags, device=dev, dtype=dtype)
        if "ring" in flags:  # codec_attention=triton
            from models.qwen3_tts.ring_attend_triton import ring_attend

            stream.attend = ring_attend
        return stream

    streams = {lay: build(lay) for lay in layouts}
    groups = loaded.config.talker.num_code_groups
    if len(streams) > 1:  # the same frames through each layout: their audio against the first's
        g = torch.Generator(device=dev).manual_seed(0)
        slots = torch.arange(min(batches), dtype=torch.int64, device=dev)
        frames = [torch.randint(0, 2048, (len(slots), groups), device=dev, generator=g) for _ in range(6)]
        with torch.inference_mode():
            audio = {}
            for lay, st in streams.items():
                st.reset(slots)
                audio[lay] = torch.cat([st.step(slots, f).float() for f in frames], dim=1)
                st.reset(slots)
        first = layouts[0]
        for lay in layouts[1:]:
            ref = audio[first]
            rel = float((audio[lay] - ref).abs().max() / ref.abs().max().clamp(min=1e-12))
            print(f"{lay} against {first}, {len(slots)} rows x 6 frames, {args.dtype}: max |diff| / max |audio| "
                  f"= {rel:.2e} (audio peak {float(ref.abs().max()):.3f})", flush=True)
    for b in batches:
        slots = torch.arange(b, dtype=torch.int64, device=dev)
        codes = torch.randint(0, 2048, (b, groups), device=dev)
        for lay, stream in streams.items():
            step = lambda: stream.step(slots, codes)  # noqa: E731
            for bench in (False, True):
                torch.backends.cudnn.benchmark = bench
                ms = graph_median_ms(step, args.iters)
                print(f"{b:5d} rows, {lay}, {args.dtype}, cudnn.benchmark={bench}: {ms:7.2f} ms a step "
                      f"({1e3 * b / ms:,.0f} frames/s)", flush=True)
            if args.top <= 0:
                continue
            with torch.inference_mode():
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        step()
                    torch.cuda.synchronize()
            print(f"== {b} rows, {lay}: kernels over 5 steps", flush=True)
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.top, max_name_column_width=90),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
