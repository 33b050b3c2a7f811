"""Paged decode attention alone at Orpheus-3B's shape: FlashInfer's CUDA-core and tensor-core
kernels and the runtime's Triton kernel (``--decode-attention triton``), bf16 and fp8 pages, in
CUDA graphs (GPU only; benchmark/gpu/README.md).

    python -m benchmark.gpu.decode_attention --batch 256,384,512 --context 128,256,512 --kv-dtype bf16,fp8"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch

from benchmark.args import choice_type, list_type, number_type

__all__ = ["main"]

HQ, HKV, D, PAGE = 24, 8, 128, 16
KV_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
KERNELS = ("cuda-cores", "tensor-cores", "triton")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    positive = number_type(int, 1)
    p.add_argument("--batch", type=list_type(positive), default=[256, 384, 512], help="decode rows")
    # served 10 s streams hold short contexts (a segment's prompt and at most 170 generated
    # tokens); 512 is the figure of the physical limit
    p.add_argument("--context", type=list_type(positive), default=[128, 256, 512], help="tokens cached per row")
    p.add_argument("--kv-dtype", type=list_type(choice_type(tuple(KV_DTYPES))), default=["bf16", "fp8"])
    p.add_argument("--kernel", type=list_type(choice_type(KERNELS)), default=list(KERNELS))
    p.add_argument("--layers", type=positive, default=28, help="decode calls per graph, each over its own cache")
    p.add_argument("--replays", type=number_type(int, 3), default=30, help="timed replays")
    p.add_argument("--json", default="", help="write the figures here")
    return p.parse_args(argv)


def _case(kv: str, kernel: str, batch: int, context: int, layers: int, replays: int, workspace: torch.Tensor) -> dict[str, Any]:
    import flashinfer

    dev = workspace.device
    pages_per_row = -(-context // PAGE)
    num_pages = batch * pages_per_row
    caches = [torch.randn(num_pages, 2, PAGE, HKV, D, device=dev, dtype=torch.bfloat16).to(KV_DTYPES[kv])
              for _ in range(layers)]
    indices = torch.randperm(num_pages, device=dev, dtype=torch.int32)
    indptr = torch.arange(0, num_pages + 1, pages_per_row, dtype=torch.int32)
    last = torch.full((batch,), context - (pages_per_row - 1) * PAGE, dtype=torch.int32)
    q = torch.randn(batch, HQ, D, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    if kernel == "triton":
        from engine.llm.decode_attention_triton import paged_decode_attention

        table = (indptr.to(dev), indices, last.to(dev))

        def step() -> None:
            for cache in caches:
                paged_decode_attention(q, cache, *table, out=out)
    else:
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_cuda_graph=True, use_tensor_cores=kernel == "tensor-cores",
            paged_kv_indptr_buffer=torch.zeros(batch + 1, dtype=torch.int32, device=dev),
            paged_kv_indices_buffer=torch.zeros(num_pages, dtype=torch.int32, device=dev),
            paged_kv_last_page_len_buffer=torch.zeros(batch, dtype=torch.int32, device=dev),
        )
        wrapper.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=torch.bfloat16, kv_data_type=KV_DTYPES[kv])

        def step() -> None:
            for cache in caches:
                wrapper.run(q, cache, out=out)

    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        step()  # warm-up outside the graph
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize(dev)
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / layers * 1000.0)  # us per layer
    per_layer = statistics.median(times)
    kv_bytes = batch * context * HKV * D * 2 * caches[0].element_size()
    return {"kv_dtype": kv, "kernel": kernel, "batch": batch, "context": context, "layers": layers,
            "us_per_layer": per_layer, "us_per_layer_p90": sorted(times)[int(0.9 * (len(times) - 1))],
            "kv_mb_per_layer": kv_bytes / 1e6, "tb_per_s": kv_bytes / (per_layer * 1e-6) / 1e12}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("decode_attention: needs a CUDA GPU", file=sys.stderr)
        return 1
    import flashinfer

    dev = torch.device("cuda")
    layers, replays = args.layers, args.replays
    print(f"decode attention on {torch.cuda.get_device_name(dev)}; torch {torch.__version__}; flashinfer "
          f"{getattr(flashinfer, '__version__', '?')}; {HQ} q heads, {HKV} kv heads, head_dim {D}, page {PAGE}; "
          f"{layers} layers per graph, median of {replays} replays", flush=True)
    print(f"{'kv':>5} {'kernel':>13} {'batch':>6} {'context':>8} {'us/layer':>9} {'p90':>8} {'MB/layer':>9} {'TB/s':>6}",
          flush=True)
    workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device=dev)
    results: list[dict[str, Any]] = []
    for kv in args.kv_dtype:
        for kernel in args.kernel:
            for context in args.context:
                for batch in args.batch:
                    t0 = time.perf_counter()
                    try:
                        r = _case(kv, kernel, batch, context, layers, replays, workspace)
                    except Exception as exc:  # a kernel FlashInfer does not build for this dtype
                        msg = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                        print(f"{kv:>5} {kernel:>13} {batch:>6} {context:>8} error {msg}", flush=True)
                        results.append({"kv_dtype": kv, "kernel": kernel, "batch": batch, "context": context,
                                        "error": msg})
                        torch.cuda.empty_cache()
                        continue
                    r["wall_s"] = time.perf_counter() - t0
                    results.append(r)
                    print(f"{kv:>5} {kernel:>13} {batch:>6} {context:>8} {r['us_per_layer']:>9.1f} "
                          f"{r['us_per_layer_p90']:>8.1f} {r['kv_mb_per_layer']:>9.1f} {r['tb_per_s']:>6.2f}", flush=True)
                    torch.cuda.empty_cache()
                    if args.json:  # after every case: a run cut short keeps what it measured
                        with open(args.json, "w") as f:
                            json.dump({"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
                                       "flashinfer": getattr(flashinfer, "__version__", "?"), "results": results}, f,
                                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
