"""The depth transformer's fused matmuls (``models/kyutai_tts/gemm_triton.py``) against the torch
ops they replace, one op at a time at Kyutai TTS's shapes, for several launch shapes: what to
set ``blocks_for`` to, and what a layer's five kernels cost against its eight.

    python -m benchmark.gpu.depth_gemm --batch 1,16,32,64,128,256 [--json F]

Each case is 32 calls in a row over 8 weight sets (a frame reads its weights from memory, not
from the L2 cache: 11 weight sets of 4 layers, some 20 MB each), captured in one CUDA graph;
the figure is the median replay over ``--iters`` divided by 32, in microseconds. "torch" is the
matmul and the pointwise work beside it as the unfused step runs them (``rms_norm``, the
matmul, the compiled silu-mul; the matmul and the residual sum), "matmul" the matmul alone;
then the queries, keys and values with the attention (``triton-attend``'s one kernel against
the matmul and ``attend_triton``'s kernel).
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["main"]

CALLS, SETS = 32, 8


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", default="1,16,32,64,128,256", help="rows, comma-separated")
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=2048, help="the gating's hidden width")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--json", help="write the table here")
    args = p.parse_args(argv)
    import torch
    import torch.nn.functional as F

    from benchmark.gpu.graph_timing import graph_median_ms
    from models.kyutai_tts.depformer import silu_mul
    from models.kyutai_tts.attend_triton import attend_codebook
    from models.kyutai_tts.gemm_triton import Blocks, blocks_for, linear_residual, linear_rms, linear_rms_attend, linear_rms_glu
    from models.kyutai_tts.layers import rms_norm

    if not torch.cuda.is_available():
        print("depth_gemm needs a CUDA GPU", file=sys.stderr)
        return 2
    dev, dt = torch.device("cuda"), torch.bfloat16
    d, hid = args.dim, args.hidden
    name = torch.cuda.get_device_name()
    uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", ""))
    print(f"depth transformer matmuls on {name} ({uuid}); torch {torch.__version__}; "
          f"median us a call over {CALLS} calls, {SETS} weight sets", flush=True)
    glu = torch.compile(silu_mul, dynamic=True, fullgraph=True)
    shapes = {"qkv (norm)": (3 * d, d), "out (residual)": (d, d), "gating in (norm, silu-mul)": (2 * hid, d),
              "gating out (residual)": (d, hid)}
    weights = {s: [torch.randn(n, k, device=dev, dtype=dt) / k ** 0.5 for _ in range(SETS)] for s, (n, k) in shapes.items()}
    alpha = torch.rand(d, device=dev, dtype=dt) + 0.5
    launches = [Blocks(16, 32), Blocks(16, 64), Blocks(16, 32, 256), Blocks(16, 64, 64), Blocks(32, 32), Blocks(32, 64),
                Blocks(64, 64), Blocks(16, 32, 128, 2), Blocks(16, 64, 128, 4, 4), Blocks(64, 128, 64, 4)]
    rows = []
    for m in [int(x) for x in args.batch.split(",")]:
        for shape, (n, k) in shapes.items():
            ws = weights[shape]
            x = torch.randn(m, k, device=dev, dtype=dt)
            res = torch.randn(m, n if "residual" in shape else d, device=dev, dtype=dt)

            def timed(one) -> float:  # noqa: ANN001
                def run() -> None:
                    for i in range(CALLS):
                        one(ws[i % SETS])
                return 1000 * graph_median_ms(run, args.iters) / CALLS

            if shape.startswith("qkv"):
                forms = {"torch": lambda w: F.linear(rms_norm(x, alpha, 1e-8), w),  # noqa: B023
                         "fused": lambda w, b=None: linear_rms(x, w, alpha, 1e-8, b)}  # noqa: B023
            elif shape.startswith("gating in"):
                forms = {"torch": lambda w: glu(F.linear(rms_norm(x, alpha, 1e-8), w).view(m, 2, -1)),  # noqa: B023
                         "fused": lambda w, b=None: linear_rms_glu(x, w, alpha, 1e-8, b)}  # noqa: B023
            else:
                forms = {"torch": lambda w: res + F.linear(x, w),  # noqa: B023
                         "fused": lambda w, b=None: linear_residual(x, w, res, b)}  # noqa: B023
            row = {"rows": m, "shape": shape, "matmul_us": timed(lambda w: F.linear(x, w)),  # noqa: B023
                   "torch_us": timed(forms["torch"]), "default": list(blocks_for(m, n if "gating in" not in shape else n // 2))}
            row["fused_us"] = timed(forms["fused"])
            tried = {}
            for b in launches:
                try:
                    tried[",".join(map(str, b))] = timed(lambda w, b=b: forms["fused"](w, b))  # noqa: B023
                except Exception as e:  # (a launch shape Triton refuses here: say so, go on)
                    tried[",".join(map(str, b))] = f"{type(e).__name__}"
            row["launches_us"] = tried
            best = min((v, kk) for kk, v in tried.items() if isinstance(v, float))
            rows.append(row)
            print(f"{m:4d} rows {shape:27s} matmul {row['matmul_us']:6.1f}  torch {row['torch_us']:6.1f}  "
                  f"fused {row['fused_us']:6.1f} (default {row['default'][:2]})  best {best[0]:6.1f} ({best[1]})", flush=True)
    # the queries, keys and values and the attention (codebook 12 of 24): torch's norm and matmul
    # then the attention kernel, the fused matmul then the attention kernel, or one kernel
    heads = 16
    qkv_w = weights["qkv (norm)"]
    for m in [int(x) for x in args.batch.split(",")]:
        x = torch.randn(m, d, device=dev, dtype=dt)
        cache = torch.randn(m, 2, heads, 24, d // heads, device=dev, dtype=dt)

        def timed_qkv(one) -> float:  # noqa: ANN001
            def run() -> None:
                for i in range(CALLS):
                    one(qkv_w[i % SETS])
            return 1000 * graph_median_ms(run, args.iters) / CALLS

        row = {"rows": m, "shape": "qkv + attention",
               "torch_us": timed_qkv(lambda w: attend_codebook(F.linear(rms_norm(x, alpha, 1e-8), w).view(m, 3, heads, -1),  # noqa: B023
                                                               cache, 12)),  # noqa: B023
               "fused_us": timed_qkv(lambda w: attend_codebook(linear_rms(x, w, alpha, 1e-8).view(m, 3, heads, -1),  # noqa: B023
                                                               cache, 12)),  # noqa: B023
               "one_kernel_us": {}}
        for b in (Blocks(16, 64), Blocks(32, 64), Blocks(16, 64, 256), Blocks(16, 64, 64), Blocks(16, 64, 128, 2),
                  Blocks(16, 64, 128, 4, 4), Blocks(64, 64)):
            try:
                row["one_kernel_us"][",".join(map(str, b))] = timed_qkv(
                    lambda w, b=b: linear_rms_attend(x, w, alpha, 1e-8, cache, 12, b))  # noqa: B023
            except Exception as e:  # (a launch shape Triton refuses here)
                row["one_kernel_us"][",".join(map(str, b))] = type(e).__name__
        rows.append(row)
        print(f"{m:4d} rows qkv + attention: torch matmul then the kernel {row['torch_us']:6.1f}, fused matmul then "
              f"the kernel {row['fused_us']:6.1f}, one kernel "
              + " ".join(f"{k}: {v:.1f}" if isinstance(v, float) else f"{k}: {v}" for k, v in row["one_kernel_us"].items()),
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": name, "uuid": uuid, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
