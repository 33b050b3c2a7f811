"""Orpheus's fused layer with its pointwise parts compiled or as Triton kernels (``orpheus_rope``,
``orpheus_silu_mul``, ``orpheus_norm``), each part alone and the forward, captured in CUDA graphs:

    python -m benchmark.gpu.layer_kernels --rows 1,64,256,448 [--iters 50] [--fp8] [--json OUT]

"rope" is one layer's rotation of q and k and the copy of v out of the QKV projection, "silu"
one layer's SiLU-mul, "norm" one residual add and RMSNorm, "kv" one layer's store of its keys
and values into a paged cache (the runtime's ``attention.write_kv``, ``--kv-write index`` or
``triton``); with ``--fp8`` also the parts that quantise an activation for fp8 weights ("normq",
"siluq": the same with the row-wise quantisation fused in; "quant": the attention's output
alone). "forward" is ``FusedLlamaForward`` over all 28 layers with random Orpheus-3B weights
(bf16; with ``--fp8`` then fp8 weights) and a stand-in for the attention (the queries pass
through, no cache: the same for every variant), with the rotation, SiLU-mul and norm as named
(``FORWARDS``): their differences are those parts' share of a decode step. Medians in ms; the
kernel counts of one eager call in brackets. Each figure alone is one CUDA graph's replay, its
launch included. ``--device cpu --preset tiny`` runs the compiled forms and index_put eagerly
(a smoke run: no Triton, no graphs).
"""

from __future__ import annotations

import argparse
import json
import platform

from benchmark.gpu.graph_timing import eager_median_ms, graph_median_ms, kernel_table

__all__ = ["main"]

# (rope, silu_mul, norm): the forms before the kernels, the default since session 44, then one
# kernel more each
FORWARDS = (("compiled", "compiled", "compiled"), ("triton", "compiled", "compiled"),
            ("triton", "triton", "compiled"), ("triton", "triton", "triton"))
FP8_FORWARDS = (("triton", "compiled", "compiled"), ("triton", "triton", "triton"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,64,256,448", help="tokens a step, comma-separated")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--preset", default="orpheus-3b", help="models.orpheus.config.PRESETS")
    p.add_argument("--device", default="cuda")
    p.add_argument("--fp8", action="store_true", help="also the fp8 quantising parts and the fp8-weight forward (CUDA)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    import torch

    from engine.llm.attention import set_kv_write, write_kv
    from engine.llm.fp8 import FP8_DTYPE, quantise_decoder_linears_, quantise_rowwise
    from models.orpheus import fused_forward as ff
    from models.orpheus import layer_triton as lt
    from models.orpheus.loader import load_orpheus

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA GPU")
    if args.fp8 and not cuda:
        p.error("--fp8: CUDA only (torch._scaled_mm)")
    dtype = torch.bfloat16 if cuda else torch.float32
    model, _, cfg = load_orpheus(args.preset, device=args.device, dtype=dtype, load_format="dummy", max_seq_len=2048)
    fwd = ff.FusedLlamaForward(model, compile=cuda)
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    kinds = ["compiled", "triton"] if cuda else ["compiled"]
    forwards = FORWARDS if cuda else FORWARDS[:1]
    time_it = (lambda fn: graph_median_ms(fn, args.iters)) if cuda else (lambda fn: eager_median_ms(fn, args.iters))
    name = torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine()
    uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", "")) if cuda else ""
    print(f"the fused layer's pointwise parts on {name} {uuid}; preset {args.preset}; torch {torch.__version__}; "
          f"{args.iters} replays each (medians, ms)")
    wrap = (lambda f: torch.compile(f, dynamic=True, fullgraph=True)) if cuda else (lambda f: f)
    compiled = {"norm": wrap(ff._add_rmsnorm), "normq": wrap(ff._add_rmsnorm_q), "siluq": wrap(ff._silu_mul_q),
                "quant": wrap(quantise_rowwise)}
    parts = ["rope", "silu", "norm"] + (["normq", "siluq", "quant"] if args.fp8 else [])
    heads = [f"{part} {k}" for part in parts for k in kinds]
    heads += [f"kv {w}" for w in (["index", "triton"] if cuda else ["index"])]
    heads += [f"forward {'/'.join(f)}" for f in forwards]
    heads += [f"fp8 forward {'/'.join(f)}" for f in (FP8_FORWARDS if args.fp8 else ())]
    print(f"{'rows':>6} " + " ".join(f"{h:>24}" for h in heads))
    g = torch.Generator(device=args.device).manual_seed(0)
    results = []
    w_norm = model.model.layers[0].post_attention_layernorm.weight
    for t in [int(x) for x in args.rows.split(",")]:
        qkv = torch.randn(t, (hq + 2 * hkv) * d, device=args.device, generator=g).to(dtype)
        gu = torch.randn(t, 2 * cfg.intermediate_size, device=args.device, generator=g).to(dtype)
        h, res = (torch.randn(t, cfg.hidden_size, device=args.device, generator=g).to(dtype) for _ in range(2))
        o = torch.randn(t, hq * d, device=args.device, generator=g).to(dtype)
        ids = torch.randint(0, cfg.vocab_size, (t,), device=args.device, generator=g)
        pos = torch.randint(0, 200, (t,), device=args.device, generator=g)
        cs = model.rope.index_select(0, pos).to(dtype)
        cos, sin = cs[:, 0:1], cs[:, 1:2]
        eps = cfg.rms_norm_eps
        triton_parts = {"norm": lambda: lt.add_rmsnorm(h, res, w_norm, eps),
                        "normq": lambda: lt.add_rmsnorm(h, res, w_norm, eps, quantise=FP8_DTYPE),
                        "siluq": lambda: lt.silu_mul(gu, quantise=FP8_DTYPE),
                        "quant": lambda: lt.quantise_rows(o, FP8_DTYPE)}
        compiled_parts = {"norm": lambda: compiled["norm"](h, res, w_norm, eps),
                          "normq": lambda: compiled["normq"](h, res, w_norm, eps),
                          "siluq": lambda: compiled["siluq"](gu), "quant": lambda: compiled["quant"](o)}
        row, cells = {"rows": t}, []
        for part in parts:
            for k in kinds:
                if part == "rope":
                    fwd.set_rope(k)
                    fn = (lambda f=fwd._rope: f(qkv, cos, sin, hq, hkv, d))
                elif part == "silu":
                    fwd.set_silu_mul(k)
                    fn = (lambda f=fwd._silu_mul: f(gu))
                else:
                    fn = (triton_parts if k == "triton" else compiled_parts)[part]
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
        for forms in forwards:
            row[f"forward_{'_'.join(forms)}_ms"] = ms = _time_forward(fwd, forms, ids, pos, time_it)
            cells.append(f"{ms:>24.3f}")
        results.append(row)
        print(f"{t:>6} " + " ".join(cells), flush=True)
    if args.fp8:  # the same forwards over fp8 weights (the bf16 forward's fused weights freed first)
        del fwd
        quantise_decoder_linears_(model)
        fwd8 = ff.FusedLlamaForward(model, compile=True)
        for row in results:
            t = row["rows"]
            ids = torch.randint(0, cfg.vocab_size, (t,), device=args.device, generator=g)
            pos = torch.randint(0, 200, (t,), device=args.device, generator=g)
            cells = []
            for forms in FP8_FORWARDS:
                row[f"fp8_forward_{'_'.join(forms)}_ms"] = ms = _time_forward(fwd8, forms, ids, pos, time_it)
                cells.append(f"{ms:>24.3f}")
            print(f"{t:>6} fp8 forward " + " ".join(cells), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "uuid": uuid, "preset": args.preset, "results": results}, f, indent=1)
    return 0


def _time_forward(fwd, forms: tuple[str, str, str], ids, pos, time_it) -> float:
    rope, silu_mul, norm = forms
    fwd.set_rope(rope)
    fwd.set_silu_mul(silu_mul)
    fwd.set_norm(norm)
    return time_it(lambda: fwd(ids, pos, lambda i, q, k, v: q))


if __name__ == "__main__":
    raise SystemExit(main())
