"""Where a streaming codec step's GPU time goes: Qwen3-TTS's codec alone, timed in a CUDA graph
with cuDNN's algorithm search off and on, then its kernels under ``torch.profiler`` (top by time).

    python -m benchmark.gpu.codec_profile --batch 512 [--dtype bfloat16] [--top 25]

GPU only; random weights (``--load-format dummy``).
"""

from __future__ import annotations

import argparse
import sys

from benchmark.gpu.graph_timing import graph_median_ms

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-tts-1.7b-customvoice", help="a preset of models.qwen3_tts.config")
    p.add_argument("--batch", default="512", help="rows, comma-separated")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--top", type=int, default=25, help="kernels listed")
    args = p.parse_args(argv)
    import torch

    from models.qwen3_tts.codec import CodecStream
    from models.qwen3_tts.loader import load_qwen3_tts

    if not torch.cuda.is_available():
        print("codec_profile needs a CUDA GPU", file=sys.stderr)
        return 2
    dev, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    batches = [int(x) for x in args.batch.split(",")]
    loaded = load_qwen3_tts(args.model, device=dev, dtype=torch.bfloat16, codec_dtype=dtype, load_format="dummy")
    stream = CodecStream(loaded.codec, max(batches), device=dev, dtype=dtype)
    groups = loaded.config.talker.num_code_groups
    for b in batches:
        slots = torch.arange(b, dtype=torch.int64, device=dev)
        codes = torch.randint(0, 2048, (b, groups), device=dev)
        step = lambda: stream.step(slots, codes)  # noqa: E731
        for bench in (False, True):
            torch.backends.cudnn.benchmark = bench
            ms = graph_median_ms(step, args.iters)
            print(f"{b:5d} rows, {args.dtype}, cudnn.benchmark={bench}: {ms:7.2f} ms a step "
                  f"({1e3 * b / ms:,.0f} frames/s)", flush=True)
        with torch.inference_mode():
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.top, max_name_column_width=90),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
