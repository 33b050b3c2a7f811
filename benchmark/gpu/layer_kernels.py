"""Orpheus's fused layer with its pointwise parts compiled or as Triton kernels (``orpheus_rope``,
``orpheus_silu_mul``), each part alone and the forward, captured in CUDA graphs:

    python -m benchmark.gpu.layer_kernels --rows 1,64,256,448 [--iters 50] [--json OUT]

"rope" is one layer's rotation of q and k and the copy of v out of the QKV projection, "silu"
one layer's SiLU-mul, "kv" one layer's store of its keys and values into a paged cache (the
runtime's ``attention.write_kv``, ``--kv-write index`` or ``triton``); "forward" is
``FusedLlamaForward`` over all 28 layers with random Orpheus-3B weights (bf16) and a stand-in for
the attention (the queries pass through, no cache: the same for every variant), with the
rotation and SiLU-mul as named (compiled / compiled, triton / compiled, triton / triton): their
differences are those parts' share of a decode step. Medians in ms; the kernel counts of one
eager call in brackets. Each figure alone is one CUDA graph's replay, its launch included.
``--device cpu --preset tiny`` runs the compiled forms and index_put eagerly (a smoke run: no
Triton, no graphs).
"""

from __future__ import annotations

import argparse
import json
import platform

from benchmark.gpu.graph_timing import eager_median_ms, graph_median_ms, kernel_table

__all__ = ["main"]

FORWARDS = (("compiled", "compiled"), ("triton", "compiled"), ("triton", "triton"))  # (rope, silu_mul)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,64,256,448", help="tokens a step, comma-separated")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--preset", default="orpheus-3b", help="models.orpheus.config.PRESETS")
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    import torch

    from engine.llm.attention import set_kv_write, write_kv
    from models.orpheus.fused_forward import FusedLlamaForward
    from models.orpheus.loader import load_orpheus

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA GPU")
    dtype = torch.bfloat16 if cuda else torch.float32
    model, _, cfg = load_orpheus(args.preset, device=args.device, dtype=dtype, load_format="dummy", max_seq_len=2048)
    fwd = FusedLlamaForward(model, compile=cuda)
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    kinds = ["compiled", "triton"] if cuda else ["compiled"]
    forwards = FORWARDS if cuda else FORWARDS[:1]
    time_it = (lambda fn: graph_median_ms(fn, args.iters)) if cuda else (lambda fn: eager_median_ms(fn, args.iters))
    name = torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine()
    uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", "")) if cuda else ""
    print(f"the fused layer's pointwise parts on {name} {uuid}; preset {args.preset}; torch {torch.__version__}; "
          f"{args.iters} replays each (medians, ms)")
    heads = [f"{part} {k}" for part in ("rope", "silu") for k in kinds]
    heads += [f"kv {w}" for w in (["index", "triton"] if cuda else ["index"])]
    heads += [f"forward {r}/{s}" for r, s in forwards]
    print(f"{'rows':>6} " + " ".join(f"{h:>24}" for h in heads))
    g = torch.Generator(device=args.device).manual_seed(0)
    results = []
    for t in [int(x) for x in args.rows.split(",")]:
        qkv = torch.randn(t, (hq + 2 * hkv) * d, device=args.device, generator=g).to(dtype)
        gu = torch.randn(t, 2 * cfg.intermediate_size, device=args.device, generator=g).to(dtype)
        ids = torch.randint(0, cfg.vocab_size, (t,), device=args.device, generator=g)
        pos = torch.randint(0, 200, (t,), device=args.device, generator=g)
        cs = model.rope.index_select(0, pos).to(dtype)
        cos, sin = cs[:, 0:1], cs[:, 1:2]
        row, cells = {"rows": t}, []
        for part in ("rope", "silu"):
            for k in kinds:
                if part == "rope":
                    fwd.set_rope(k)
                    fn = (lambda f=fwd._rope: f(qkv, cos, sin, hq, hkv, d))
                else:
                    fwd.set_silu_mul(k)
                    fn = (lambda f=fwd._silu_mul: f(gu))
                row[f"{part}_{k}_ms"] = ms = time_it(fn)
                count = kernel_table(fn, 0)[0] if cuda else None
                row[f"{part}_{k}_kernels"] = count
                cells.append(f"{ms:>15.4f}" + f" ({count if count is not None else '-'})".rjust(9))
        page_size, pages = 16, (t + 15) // 16 + 1
        cache = torch.zeros(pages, 2, page_size, hkv, d, device=args.device, dtype=dtype)
        slots = torch.randperm(pages * page_size, device=args.device, generator=g)[:t]
        page, offset = slots // page_size, slots % page_size
        k_new, v_new = qkv[:, hq * d : (hq + hkv) * d].reshape(t, hkv, d), qkv[:, (hq + hkv) * d :].reshape(t, hkv, d)
        for w in (["index", "triton"] if cuda else ["index"]):
            set_kv_write(w)
            fn = (lambda: write_kv(cache, page, offset, k_new, v_new))
            row[f"kv_{w}_ms"] = ms = time_it(fn)
            count = kernel_table(fn, 0)[0] if cuda else None
            row[f"kv_{w}_kernels"] = count
            cells.append(f"{ms:>15.4f}" + f" ({count if count is not None else '-'})".rjust(9))
        set_kv_write("index")
        for r, s in forwards:
            fwd.set_rope(r)
            fwd.set_silu_mul(s)
            row[f"forward_{r}_{s}_ms"] = ms = time_it(lambda: fwd(ids, pos, lambda i, q, k, v: q))
            cells.append(f"{ms:>24.3f}")
        results.append(row)
        print(f"{t:>6} " + " ".join(cells), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "uuid": uuid, "preset": args.preset, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
