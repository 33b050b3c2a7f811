"""Kyutai TTS's voice cross-attention alone, three ways, timed and checked against float32: each
row attends to its own voice's positions among a bank of several voices' keys.

    python -m benchmark.gpu.cross_attention --rows 1,64,128,256 [--json F]
    python -m benchmark.gpu.cross_attention --device cpu --rows 2 --voices 2 --positions 16   # a smoke run

``explicit``: the scores in memory (bfloat16 matmul, float32 softmax over the masked scores, the
model's form before `ac79cff`); ``sdpa3``: torch's attention on [H, T, D] inputs with the mask;
``sdpa4``: the same on [1, H, T, D] inputs (``VoiceBank.attend`` since `12e0fb2`); ``triton``
(on a GPU): ``cross_triton.attend_voices``, only the voices in use (``kyutai_cross_attention``;
``--used-voices N`` draws the rows' voices from the first N, as a server speaking few voices
does, where the others read every voice whatever the rows). One layer,
bfloat16 (float32 on the CPU), each way replayed in a CUDA graph (median µs); the error is the
largest absolute difference from a float32 computation. The model's own shapes by default: 16
heads of 128, 8 voices of 625 positions.
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmark.gpu.graph_timing import eager_median_ms, graph_median_ms

__all__ = ["main"]


def _ways(k, v, owner, head_dim: int) -> dict:  # noqa: ANN001
    """The three forms, each (q [T, H, D], rows [T]) -> [T, H * D]; k, v [S, H, D]."""
    import torch
    import torch.nn.functional as F

    def explicit(q, rows):  # noqa: ANN001, ANN202
        mask = owner[None, :] == rows[:, None]
        scores = torch.matmul(q.transpose(0, 1), k.permute(1, 2, 0)).float() * head_dim ** -0.5
        scores = scores.masked_fill(~mask[None], float("-inf"))
        return torch.matmul(scores.softmax(-1).to(v.dtype), v.transpose(0, 1)).transpose(0, 1).flatten(1)

    def sdpa3(q, rows):  # noqa: ANN001, ANN202
        mask = (owner[None, :] == rows[:, None])[None]
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask)
        return o.transpose(0, 1).flatten(1)

    def sdpa4(q, rows):  # noqa: ANN001, ANN202
        mask = (owner[None, :] == rows[:, None])[None, None]
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                           attn_mask=mask)
        return o[0].transpose(0, 1).flatten(1)

    ways = {"explicit": explicit, "sdpa3": sdpa3, "sdpa4": sdpa4}
    if k.is_cuda:
        from models.kyutai_tts.cross_triton import attend_voices

        voices = int(owner.max()) + 1
        kb, vb = k.view(voices, -1, *k.shape[1:]), v.view(voices, -1, *v.shape[1:])  # [V, L, H, D]
        ways["triton"] = lambda q, rows: attend_voices(q, kb, vb, rows)
    return ways


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,64,128,256", help="query rows, comma-separated")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--voices", type=int, default=8, help="the bank's voices")
    p.add_argument("--positions", type=int, default=625, help="positions a voice")
    p.add_argument("--used-voices", type=int, default=0, help="the rows' voices drawn from this many (0: all)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--json", help="write the table here")
    args = p.parse_args(argv)
    import torch

    on_gpu = args.device == "cuda"
    if on_gpu and not torch.cuda.is_available():
        print("cross_attention needs a CUDA GPU (or --device cpu)", file=sys.stderr)
        return 2
    dev, dtype = torch.device(args.device), torch.bfloat16 if on_gpu else torch.float32
    g = torch.Generator(device=dev).manual_seed(0)
    h, d, n = args.heads, args.head_dim, args.voices * args.positions
    k = torch.randn(n, h, d, device=dev, dtype=dtype, generator=g)
    v = torch.randn(n, h, d, device=dev, dtype=dtype, generator=g)
    owner = torch.arange(args.voices, device=dev).repeat_interleave(args.positions)
    ways = _ways(k, v, owner, d)
    name = torch.cuda.get_device_name() if on_gpu else "cpu"
    uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", "")) if on_gpu else ""
    print(f"voice cross-attention, one layer, on {name} {uuid}; {h} heads of {d}, {args.voices} voices of "
          f"{args.positions} positions; µs (median), max abs error against float32", flush=True)
    table = []
    with torch.inference_mode():
        for t in (int(x) for x in args.rows.split(",")):
            q = torch.randn(t, h, d, device=dev, dtype=dtype, generator=g)
            rows = torch.randint(0, args.used_voices or args.voices, (t,), device=dev, generator=g)
            mask = owner[None, :] == rows[:, None]
            s = torch.einsum("thd,shd->hts", q.float(), k.float()) * d ** -0.5
            ref = torch.einsum("hts,shd->thd", s.masked_fill(~mask[None], float("-inf")).softmax(-1), v.float())
            ref = ref.flatten(1)
            row: dict = {"rows": t}
            for way, fn in ways.items():
                call = lambda fn=fn: fn(q, rows)  # noqa: E731
                row[f"{way}_us"] = 1e3 * (graph_median_ms(call, args.iters) if on_gpu
                                          else eager_median_ms(call, args.iters))
                row[f"{way}_err"] = float((call().float() - ref).abs().max())
            table.append(row)
            print(f"{t:5d} rows: " + "  ".join(f"{w} {row[f'{w}_us']:8.1f} µs (err {row[f'{w}_err']:.1e})"
                                               for w in ways), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": name, "uuid": uuid, "heads": h, "head_dim": d, "voices": args.voices,
                       "positions": args.positions, "rows": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
