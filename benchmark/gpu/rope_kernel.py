"""Orpheus's rotary embedding, compiled against the Triton kernel (``orpheus_rope``), alone and
inside the fused forward, each captured in a CUDA graph:

    python -m benchmark.gpu.rope_kernel --rows 1,64,256,448 [--iters 50] [--json OUT]

"rope" is one layer's rotation of q and k and the copy of v out of the QKV projection; "forward"
is ``FusedLlamaForward`` over all 28 layers with random Orpheus-3B weights (bf16) and a stand-in
for the attention (the queries pass through: the same for both), so the difference between its
two columns is the rotation's share of a decode step. Medians in ms; the kernel counts of one
eager call in brackets. ``--device cpu --preset tiny`` runs the compiled form eagerly (a smoke
run: no Triton, no graphs).
"""

from __future__ import annotations

import argparse
import json
import platform

from benchmark.gpu.graph_timing import eager_median_ms, graph_median_ms, kernel_table

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,64,256,448", help="tokens a step, comma-separated")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--preset", default="orpheus-3b", help="models.orpheus.config.PRESETS")
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    import torch

    from models.orpheus.fused_forward import FusedLlamaForward
    from models.orpheus.loader import load_orpheus

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA GPU")
    dtype = torch.bfloat16 if cuda else torch.float32
    model, _, cfg = load_orpheus(args.preset, device=args.device, dtype=dtype, load_format="dummy", max_seq_len=2048)
    fwd = FusedLlamaForward(model, compile=cuda)
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    variants = ["compiled", "triton"] if cuda else ["compiled"]
    time_it = (lambda fn: graph_median_ms(fn, args.iters)) if cuda else (lambda fn: eager_median_ms(fn, args.iters))
    name = torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine()
    uuid = ""
    if cuda:
        props = torch.cuda.get_device_properties(0)
        uuid = str(getattr(props, "uuid", ""))
    print(f"rotary embedding on {name} {uuid}; preset {args.preset}; torch {torch.__version__}; "
          f"{args.iters} replays each (medians, ms)")
    print(f"{'rows':>6} " + " ".join(f"{'rope ' + v:>22}" for v in variants)
          + " " + " ".join(f"{'forward ' + v:>22}" for v in variants))
    g = torch.Generator(device=args.device).manual_seed(0)
    results = []
    for t in [int(x) for x in args.rows.split(",")]:
        qkv = torch.randn(t, (hq + 2 * hkv) * d, device=args.device, generator=g).to(dtype)
        ids = torch.randint(0, cfg.vocab_size, (t,), device=args.device, generator=g)
        pos = torch.randint(0, 200, (t,), device=args.device, generator=g)
        cs = model.rope.index_select(0, pos).to(dtype)
        cos, sin = cs[:, 0:1], cs[:, 1:2]
        row = {"rows": t}
        for v in variants:
            fwd.set_rope(v)
            rope = fwd._rope
            row[f"rope_{v}_ms"] = time_it(lambda: rope(qkv, cos, sin, hq, hkv, d))
            row[f"forward_{v}_ms"] = time_it(lambda: fwd(ids, pos, lambda i, q, k, v_: q))
            if cuda:
                row[f"rope_{v}_kernels"] = kernel_table(lambda: rope(qkv, cos, sin, hq, hkv, d), 0)[0]
        results.append(row)
        cells = [f"{row[f'rope_{v}_ms']:>14.4f}" + (f" ({row.get(f'rope_{v}_kernels', '-')})".rjust(8)) for v in variants]
        cells += [f"{row[f'forward_{v}_ms']:>22.3f}" for v in variants]
        print(f"{t:>6} " + " ".join(cells), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "uuid": uuid, "preset": args.preset, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
