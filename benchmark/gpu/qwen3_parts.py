"""Qwen3-TTS's step split on a GPU: the talker, the code predictor and the codec, each alone.

    python -m benchmark.gpu.qwen3_parts --batch 1,64,256,512,1024 [--model qwen3-tts-1.7b-customvoice]

What each part measures: benchmark/gpu/README.md. GPU only.
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmark.gpu.graph_timing import graph_median_ms

__all__ = ["main"]


class _DenseDecode:
    """attn(layer, q [B, Hq, D], k/v [B, Hkv, D]): one new token per row over ``context`` cached."""

    def __init__(self, layers: int, b: int, context: int, kv_heads: int, head_dim: int, dtype, device) -> None:  # noqa: ANN001
        import torch

        self.k = [torch.randn(b, kv_heads, context, head_dim, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.randn_like(t) for t in self.k]

    def __call__(self, layer: int, q, k, v):  # noqa: ANN001, ANN204
        import torch.nn.functional as F

        kc, vc = self.k[layer], self.v[layer]
        kc[:, :, -1] = k
        vc[:, :, -1] = v
        o = F.scaled_dot_product_attention(q[:, :, None], kc, vc, enable_gqa=True)  # [B, Hq, 1, D]
        return o[:, :, 0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-tts-1.7b-customvoice", help="a preset of models.qwen3_tts.config")
    p.add_argument("--batch", default="1,64,256,512,1024", help="rows, comma-separated")
    p.add_argument("--context", type=int, default=128, help="cached tokens per row for the talker")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--json", help="write the table here")
    p.add_argument("--compile", action="store_true",
                   help="also time torch.compile'd (dynamic batch) frame head and bf16 codec step")
    args = p.parse_args(argv)
    import torch

    from engine.llm.sampler import Sampler
    from models.qwen3_tts.code_predictor import code0_mask, decode_frame
    from models.qwen3_tts.codec import CodecStream
    from models.qwen3_tts.loader import load_qwen3_tts

    if not torch.cuda.is_available():
        print("qwen3_parts needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    batches = [int(x) for x in args.batch.split(",")]
    loaded = load_qwen3_tts(args.model, device=dev, dtype=torch.bfloat16, load_format="dummy")
    talker, cfg = loaded.model.talker, loaded.config.talker
    import copy

    stream = CodecStream(loaded.codec, max(batches), device=dev, dtype=torch.float32)
    codec16 = copy.deepcopy(loaded.codec).to(torch.bfloat16)
    stream16 = CodecStream(codec16, max(batches), device=dev, dtype=torch.bfloat16)
    sampler = Sampler()
    allowed = code0_mask(cfg, dev)
    rows = []

    def compiled_head(hidden, sample):  # noqa: ANN001, ANN202
        fn = torch.compile(lambda h: decode_frame(talker, h, sample, allowed=allowed), dynamic=True)
        return lambda: fn(hidden)

    for b in batches:
        hidden = torch.randn(b, cfg.hidden_size, dtype=torch.bfloat16, device=dev)
        temp = torch.full((b,), 0.9, device=dev)
        ones = torch.ones(b, device=dev)
        top_k = torch.full((b,), 50, dtype=torch.int64, device=dev)
        seeds = torch.arange(b, dtype=torch.int64, device=dev)
        steps = torch.full((b,), 5, dtype=torch.int64, device=dev)

        def sample(logits, salt):  # noqa: ANN001, ANN202
            return sampler(logits, temperature=temp, top_p=ones, repetition_penalty=ones, seeds=seeds,
                           steps=steps, top_k=top_k, salt=salt)

        attn = _DenseDecode(cfg.num_hidden_layers, b, args.context, cfg.num_key_value_heads, cfg.head_dim,
                            torch.bfloat16, dev)
        pos = torch.full((b,), args.context - 1, dtype=torch.int64, device=dev)
        text = torch.randint(0, 1000, (b,), device=dev)
        codes = torch.randint(0, 2048, (b, cfg.num_code_groups), device=dev)
        slots = torch.arange(b, dtype=torch.int64, device=dev)
        talker_ms = graph_median_ms(lambda: talker(talker.embed_decode(text, codes), pos, attn), args.iters)
        head_ms = graph_median_ms(lambda: decode_frame(talker, hidden, sample, allowed=allowed), args.iters)
        codec_ms = graph_median_ms(lambda: stream.step(slots, codes), args.iters)
        codec16_ms = graph_median_ms(lambda: stream16.step(slots, codes), args.iters)
        row = {"rows": b, "talker_ms": talker_ms, "frame_head_ms": head_ms, "codec_fp32_ms": codec_ms,
               "codec_bf16_ms": codec16_ms, "sum_bf16_ms": talker_ms + head_ms + codec16_ms}
        if args.compile:
            try:
                head_c = compiled_head(hidden, sample)
                codec_c = torch.compile(stream16.step, dynamic=True)
                row["frame_head_compiled_ms"] = graph_median_ms(head_c, args.iters)
                row["codec_bf16_compiled_ms"] = graph_median_ms(lambda: codec_c(slots, codes), args.iters)
                print(f"      compiled: frame head {row['frame_head_compiled_ms']:7.2f} ms  codec bf16 "
                      f"{row['codec_bf16_compiled_ms']:7.2f} ms", flush=True)
            except Exception as exc:  # a measurement, not the product: say why and go on
                print(f"      compiled variants failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        rows.append(row)
        print(f"{b:5d} rows: talker {talker_ms:7.2f} ms  frame head {head_ms:7.2f} ms  codec fp32 {codec_ms:7.2f} / "
              f"bf16 {codec16_ms:7.2f} ms  sum (bf16 codec) {row['sum_bf16_ms']:7.2f} ms  (real time: <= 80 ms)",
              flush=True)
        attn = None
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "context": args.context, "device": torch.cuda.get_device_name(),
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
