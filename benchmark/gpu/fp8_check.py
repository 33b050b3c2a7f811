"""The fp8 options on one GPU: logit deviation, K/V range, decode step time and memory for bf16,
fp8 KV cache, fp8 weights and both (benchmark/gpu/README.md).

    python -m benchmark.gpu.fp8_check --json fp8.json [--quick] [--engine] [--flashinfer-prefill]"""

from __future__ import annotations

import argparse
import copy
import json
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmark.args import list_type, number_type
from benchmark.gpu.gpu_check import (
    AUDIO_BASE,
    NUM_AUDIO_IDS,
    PAGE,
    STOP_ID,
    _batch,
    _decode_batch,
    _inputs,
    _log,
    _median_ms,
    _versions,
)
from engine.llm.attention import build_attention_metadata, torch_paged_attention_factory
from engine.llm.fp8 import FP8_DTYPE, FP8_MAX, quantise_decoder_linears_
from engine.llm.model_runner import ModelRunner, kv_bytes_per_page
from engine.llm.sequence import SamplingParams, Sequence

__all__ = ["main"]

BF16 = torch.bfloat16
MAX_LEN = 2048
VARIANTS = ("bf16", "kv-fp8", "w-fp8", "w+kv-fp8")
PROMPT_LENGTHS = (40, 57, 73, 88, 101, 23, 64, 120)
FP8_MIN_NORMAL = 2.0**-6


def _variant(name: str, models: dict[str, Any]) -> tuple[Any, torch.dtype | None]:
    """(model, kv cache dtype) of a variant."""
    return models["fp8" if name.startswith("w") else "bf16"], (FP8_DTYPE if "kv" in name else None)


def build_models(report: dict[str, Any]) -> dict[str, Any]:
    """bf16 dummy Orpheus-3B, its fp8-quantised copy and an fp32 copy (same random weights)."""
    from models.orpheus.loader import load_orpheus

    t = time.perf_counter()
    model, _tok, cfg = load_orpheus("orpheus-3b", device="cuda", dtype=BF16, load_format="dummy", max_seq_len=MAX_LEN)
    fp32 = copy.deepcopy(model).float()
    fp8 = quantise_decoder_linears_(copy.deepcopy(model))
    torch.cuda.synchronize()
    report["build_models_s"] = time.perf_counter() - t

    def layer_bytes(m: Any) -> int:
        ts = list(m.model.layers.parameters()) + list(m.model.layers.buffers())
        return sum(x.numel() * x.element_size() for x in ts)

    report["memory"] = {
        "decoder_weights_bf16_gb": layer_bytes(model) / 1e9,
        "decoder_weights_fp8_gb": layer_bytes(fp8) / 1e9,
        "embedding_head_bf16_gb": model.model.embed_tokens.weight.numel() * 2 / 1e9,
        "kv_bytes_per_page_bf16": kv_bytes_per_page(cfg, PAGE, BF16),
        "kv_bytes_per_page_fp8": kv_bytes_per_page(cfg, PAGE, FP8_DTYPE),
    }
    _log(f"models ready in {report['build_models_s']:.1f}s: {report['memory']}")
    return {"bf16": model, "fp8": fp8, "fp32": fp32, "config": cfg}


# -- 1. + 2. logits and K/V range -----------------------------------------------------------------


def _prompts(n: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    lengths = [PROMPT_LENGTHS[i % len(PROMPT_LENGTHS)] for i in range(n)]
    return [torch.randint(0, 128000, (k,), generator=gen).tolist() for k in lengths]


def _fresh_seqs(prompts: list[list[int]]) -> list[Sequence]:
    per = MAX_LEN // PAGE
    return [Sequence(seq_id=i, prompt_ids=list(p), params=SamplingParams(temperature=0.0), slot=i,
                     pages=list(range(i * per, (i + 1) * per))) for i, p in enumerate(prompts)]


def _run_steps(runner: Any, prompts: list[list[int]], steps: int, teacher: list[list[int]] | None,
               graphs: bool) -> tuple[list[torch.Tensor], list[list[int]], list[Sequence]]:
    """Prefill, then ``steps`` decode steps; float32 logits per step (CPU), greedy tokens per step."""
    seqs = _fresh_seqs(prompts)
    n = len(seqs)
    logits_steps, tokens_steps = [], []
    batch = _batch(seqs, [s.num_prompt_tokens for s in seqs], 0)
    for step in range(steps + 1):
        meta = build_attention_metadata(batch, PAGE)
        with torch.inference_mode():
            if step > 0 and graphs:
                ids, *extras = runner.graph_inputs(batch)
                _, logits = runner.graphs.run(ids, meta, *extras)
            else:
                logits = runner._forward(_inputs(batch), meta)
        logits = logits.float().cpu()  # [B, V]
        tokens = logits.argmax(-1).tolist() if teacher is None else teacher[step]
        logits_steps.append(logits)
        tokens_steps.append(tokens)
        for s, k, t in zip(seqs, batch.num_new_tokens, tokens):
            s.num_computed_tokens += k
            s.output_ids.append(int(t))
        batch = _batch(seqs, [1] * n, n)
    return logits_steps, tokens_steps, seqs


def _kv_range(runner: Any, seqs: list[Sequence]) -> dict[str, Any]:
    """max |K|, |V| and the fp8-relevant fractions over every token written to the cache."""
    pages, offsets = [], []
    for s in seqs:
        for pos in range(s.num_computed_tokens):
            pages.append(s.pages[pos // PAGE])
            offsets.append(pos % PAGE)
    dev = runner.kv_caches[0].device
    page, off = torch.tensor(pages, device=dev), torch.tensor(offsets, device=dev)
    out: dict[str, Any] = {"tokens": len(pages), "k_amax_per_layer": [], "v_amax_per_layer": []}
    sat = sub = total = 0
    for cache in runner.kv_caches:
        for j, key in ((0, "k_amax_per_layer"), (1, "v_amax_per_layer")):
            x = cache[:, j][page, off].float().abs()  # [N, Hkv, D]
            out[key].append(float(x.max()))
            sat += int((x > FP8_MAX).sum())
            sub += int(((x < FP8_MIN_NORMAL) & (x > 0)).sum())
            total += x.numel()
    out["k_amax"], out["v_amax"] = max(out["k_amax_per_layer"]), max(out["v_amax_per_layer"])
    out["frac_saturated"], out["frac_subnormal"] = sat / total, sub / total
    return out


def _compare(got: list[torch.Tensor], ref: list[torch.Tensor]) -> dict[str, float]:
    audio = slice(AUDIO_BASE, AUDIO_BASE + NUM_AUDIO_IDS)
    max_abs, rels, agree, agree_audio, rows = 0.0, [], 0, 0, 0
    for g, r in zip(got, ref):
        g, r = g.double(), r.double()
        if not torch.isfinite(g).all():
            return {"max_abs": float("nan"), "rel_worst": float("nan"), "rel_mean": float("nan"),
                    "top1": float("nan"), "top1_audio": float("nan")}
        max_abs = max(max_abs, float((g - r).abs().max()))
        rels.append(float((g - r).norm() / r.norm()))
        agree += int((g.argmax(-1) == r.argmax(-1)).sum())
        agree_audio += int((g[:, audio].argmax(-1) == r[:, audio].argmax(-1)).sum())
        rows += g.shape[0]
    return {"max_abs": max_abs, "rel_worst": max(rels), "rel_mean": sum(rels) / len(rels),
            "top1": agree / rows, "top1_audio": agree_audio / rows}


def check_logits(report: dict[str, Any], models: dict[str, Any], args: argparse.Namespace) -> None:
    from engine.llm.cuda_graphs import CudaGraphModelRunner

    cfg = models["config"]
    prompts = _prompts(args.prompts)
    num_pages = len(prompts) * (MAX_LEN // PAGE) + 1
    fp32 = ModelRunner(models["fp32"], cfg, device="cuda", dtype=torch.float32, num_pages=num_pages,
                       max_num_seqs=len(prompts))
    ref32, teacher, _ = _run_steps(fp32, prompts, args.steps, None, graphs=False)
    del fp32
    models.pop("fp32")
    torch.cuda.empty_cache()
    _log("fp32 reference done")
    logits: dict[str, list[torch.Tensor]] = {}
    for name in VARIANTS:
        model, kv = _variant(name, models)
        t = time.perf_counter()
        runner = None
        try:
            runner = CudaGraphModelRunner(
                model, cfg, device="cuda", dtype=BF16, num_pages=num_pages, max_model_len=MAX_LEN,
                max_num_seqs=len(prompts), decode_buckets=(len(prompts),), prefill_buckets=(), progress=False,
                attention_backend_factory=torch_paged_attention_factory, kv_cache_dtype=kv,
            )
            logits[name], _, seqs = _run_steps(runner, prompts, args.steps, teacher, graphs=True)
            if name == "bf16":
                report["kv_range_bf16"] = _kv_range(runner, seqs)
                _log(f"K/V range (bf16 cache): {({k: v for k, v in report['kv_range_bf16'].items() if 'layer' not in k})}")
        except Exception as e:  # noqa: BLE001  (one variant failing must not hide the others)
            traceback.print_exc()
            report["errors"].append(f"logits {name}: {type(e).__name__}: {e}")
        _log(f"variant {name}: {time.perf_counter() - t:.1f}s")
        del runner
        torch.cuda.empty_cache()
    if "bf16" not in logits:
        raise RuntimeError("the bf16 variant failed: nothing to compare with")
    rows = []
    for name in [n for n in VARIANTS if n in logits]:
        row = {"variant": name, "vs_bf16": _compare(logits[name], logits["bf16"]), "vs_fp32": _compare(logits[name], ref32)}
        rows.append(row)
        _log(f"logits {row}")
    report["logits"] = {"prompts": len(prompts), "prompt_tokens": [len(p) for p in prompts],
                        "decode_steps": args.steps, "rows": rows}


# -- 3. decode step time --------------------------------------------------------------------------


def bench_decode(report: dict[str, Any], models: dict[str, Any], args: argparse.Namespace) -> None:
    from engine.llm.cuda_graphs import CudaGraphModelRunner

    cfg = models["config"]
    batches = args.batches
    per = -(-(args.context + 1) // PAGE)
    num_pages = max(batches) * per + 16
    audio_ids = torch.tensor([*range(AUDIO_BASE, AUDIO_BASE + NUM_AUDIO_IDS), STOP_ID])
    rows = {b: {"batch": b, "context": args.context} for b in batches}
    for name in VARIANTS:
        model, kv = _variant(name, models)
        t = time.perf_counter()
        runner = None
        try:
            runner = CudaGraphModelRunner(
                model, cfg, device="cuda", dtype=BF16, num_pages=num_pages, max_model_len=MAX_LEN,
                max_num_seqs=max(batches), vocab_ids=audio_ids, decode_buckets=batches, prefill_buckets=(),
                capture=False, progress=False, kv_cache_dtype=kv,
            )
            noise = torch.randn(runner.kv_caches[0].shape, device="cuda", dtype=BF16)
            for cache in runner.kv_caches:
                cache.copy_(noise)  # random K/V (never time on zeros); one draw for all layers
            del noise
            runner.capture(progress=False)
            for b in batches:
                batch = _decode_batch(runner, b, args.context, 0)
                runner.execute(batch)  # plans this batch's graph
                g = runner.graphs._graphs[b].graph
                rows[b][f"{name}_ms"] = _median_ms(g.replay, args.iters, events=True)
            _log(f"decode {name}: {[rows[b][f'{name}_ms'] for b in batches]} ms ({time.perf_counter() - t:.1f}s)")
        except Exception as e:  # noqa: BLE001  (one variant failing must not hide the others)
            traceback.print_exc()
            report["errors"].append(f"decode {name}: {type(e).__name__}: {e}")
        del runner
        torch.cuda.empty_cache()
    report["decode"] = list(rows.values())


# -- 5. FlashInfer eager attention over fp8 pages ------------------------------------------------


def check_flashinfer_prefill(report: dict[str, Any]) -> None:
    """Mixed decode + prefill step: FlashInferAttention vs TorchPagedAttention on the same fp8 pages."""
    from engine.llm.attention import KVCacheSpec, TorchPagedAttention, allocate_kv_caches
    from engine.llm.flashinfer_attention import FlashInferAttention

    hq, hkv, d = 24, 8, 128
    specs = [(300, 1), (77, 1), (511, 1), (0, 90), (64, 40)]  # (cached tokens, new tokens)
    seqs, pages_used = [], 0
    for i, (done, new) in enumerate(specs):
        k = -(-(done + new) // PAGE)
        s = Sequence(seq_id=i, prompt_ids=list(range(done + new)), params=SamplingParams(), slot=i,
                     pages=list(range(pages_used, pages_used + k)))
        s.num_computed_tokens = done
        pages_used += k
        seqs.append(s)
    spec = KVCacheSpec(num_layers=1, num_pages=pages_used + 1, page_size=PAGE, num_qo_heads=hq, num_kv_heads=hkv,
                       head_dim=d, dtype=BF16, device=torch.device("cuda"), max_num_seqs=8, cache_dtype=FP8_DTYPE)
    ref_caches = allocate_kv_caches(spec)
    ref_caches[0].copy_(torch.randn(ref_caches[0].shape, device="cuda"))
    fi_caches = [c.clone() for c in ref_caches]
    meta = build_attention_metadata(_batch(seqs, [n for _, n in specs], 3), PAGE)
    t = int(meta.qo_indptr[-1])
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(t, h, d, device="cuda", generator=gen).to(BF16) for h in (hq, hkv, hkv))
    ref, fi = TorchPagedAttention(spec, ref_caches), FlashInferAttention(fi_caches, num_q_heads=hq)
    ref.begin_step(meta)
    fi.begin_step(meta)
    with torch.inference_mode():
        want, got = ref(0, q, k, v).double(), fi(0, q, k, v).double()
    nd = 3
    report["flashinfer_fp8_attention"] = {
        "decode_rel": float((got[:nd] - want[:nd]).norm() / want[:nd].norm()),
        "prefill_rel": float((got[nd:] - want[nd:]).norm() / want[nd:].norm()),
        "max_abs": float((got - want).abs().max()),
        "cache_equal": bool(torch.equal(fi_caches[0].view(torch.uint8), ref_caches[0].view(torch.uint8))),
    }
    _log(f"FlashInfer fp8 attention vs torch: {report['flashinfer_fp8_attention']}")


# -- 6. the serving path with both options -----------------------------------------------------


def check_engine(report: dict[str, Any], models: dict[str, Any], args: argparse.Namespace) -> None:
    """build_orpheus_backend(kv_cache_dtype="fp8", quantization="fp8") starts and serves jobs."""
    from models.orpheus.build import build_orpheus_backend

    models.clear()  # free the check's models first (the builder sizes the KV cache from free memory)
    torch.cuda.empty_cache()
    t = time.perf_counter()
    backend = build_orpheus_backend("orpheus-3b", device="cuda", load_format="dummy", max_num_seqs=32,
                                    max_model_len=2048, kv_cache_dtype="fp8", quantization="fp8", warmup=True)
    row: dict[str, Any] = {"build_and_warmup_s": time.perf_counter() - t,
                           "kv_dtype": str(backend.runner.kv_caches[0].dtype),
                           "num_pages": backend.runner.spec.num_pages, "jobs": args.engine_jobs}
    t = time.perf_counter()
    audio = {j: 0 for j in range(args.engine_jobs)}
    errors, finished = [], set()
    for j in range(args.engine_jobs):
        voice, opts = backend.validate(None, {"seed": j, "max_tokens": 140})
        backend.add_job(j, f"Job number {j}: the ferry left the harbour at half past nine.", voice, opts)
    for _ in range(2000):
        if not backend.has_work():
            break
        for o in backend.step():
            if o.error is not None:
                errors.append(f"job {o.job_id}: {o.error.message}")
            if o.pcm is not None:
                audio[o.job_id] += int(o.pcm.size)
            if o.is_finished:
                finished.add(o.job_id)
    row.update(run_s=time.perf_counter() - t, finished=len(finished), errors=errors,
               audio_samples_min=min(audio.values()), ok=not errors and len(finished) == args.engine_jobs)
    backend.close()
    report["engine_fp8"] = row
    _log(f"engine with fp8 KV + weights: {row}")
    if not row["ok"]:
        raise RuntimeError(f"the fp8 engine did not serve every job: {row}")


# -- report ------------------------------------------------------------------------------------


def _f(x: Any, fmt: str = ".3g") -> str:
    return "-" if x is None else format(x, fmt)


def _ms(x: float | None) -> str:
    return f"{'-':>8s}" if x is None else f"{x:8.2f}"


def table(r: dict[str, Any]) -> str:
    v = r["versions"]
    lines = [f"fp8 check | GPU {v.get('gpu')} | torch {v['torch']} (CUDA {v['cuda']}) | flashinfer {v['flashinfer']}",
             "Random dummy Orpheus-3B weights; figures are this run's, not a real checkpoint's.", ""]
    if "logits" in r:
        lg = r["logits"]
        lines.append(f"[1] logits, {lg['prompts']} prompts x (prefill + {lg['decode_steps']} graphed decode steps), "
                     "same input tokens for every variant; rel = ||dlogits|| / ||ref|| (worst step)")
        lines.append("variant  | vs bf16: max|d|  rel     top1  top1(audio) | vs fp32: max|d|  rel     top1")
        for row in lg["rows"]:
            a, b = row["vs_bf16"], row["vs_fp32"]
            lines.append(f"{row['variant']:8s} | {_f(a['max_abs']):>14s} {_f(a['rel_worst']):>7s} {a['top1']:5.3f} "
                         f"{a['top1_audio']:11.3f} | {_f(b['max_abs']):>14s} {_f(b['rel_worst']):>7s} {b['top1']:5.3f}")
    if "kv_range_bf16" in r:
        k = r["kv_range_bf16"]
        lines.append(f"[2] K/V range in the bf16 cache ({k['tokens']} tokens x {len(k['k_amax_per_layer'])} layers): max|K| {k['k_amax']:.3g}, "
                     f"max|V| {k['v_amax']:.3g} (fp8 max 448); saturated {k['frac_saturated']:.2e}, "
                     f"subnormal (<2^-6) {k['frac_subnormal']:.2e}")
    if "decode" in r:
        lines.append("[3] decode step, one CUDA graph (fused forward + audio-ids head + sampler), ms (median replay)")
        lines.append("batch | ctx | " + " | ".join(f"{n:>8s}" for n in VARIANTS) + " | w+kv-fp8 speed-up")
        for d in r["decode"]:
            ms = [d.get(f"{n}_ms") for n in VARIANTS]
            sp = ms[0] / ms[3] if ms[0] and ms[3] else None
            lines.append(f"{d['batch']:5d} | {d['context']} | " + " | ".join(_ms(x) for x in ms)
                         + f" | {_f(sp, '.2f')}x")
    if "memory" in r:
        m = r["memory"]
        lines.append(f"[4] decoder weights {m['decoder_weights_bf16_gb']:.2f} GB bf16 -> {m['decoder_weights_fp8_gb']:.2f} GB "
                     f"fp8 (+ {m['embedding_head_bf16_gb']:.2f} GB bf16 embedding/head); KV page "
                     f"{m['kv_bytes_per_page_bf16'] / 2**20:.2f} MiB bf16 -> {m['kv_bytes_per_page_fp8'] / 2**20:.2f} MiB fp8")
    if "flashinfer_fp8_attention" in r:
        f = r["flashinfer_fp8_attention"]
        lines.append(f"[5] FlashInfer eager attention over fp8 pages vs torch: decode rel {f['decode_rel']:.2e}, "
                     f"prefill rel {f['prefill_rel']:.2e}, max|d| {f['max_abs']:.3g}, same cache bytes {f['cache_equal']}")
    if "engine_fp8" in r:
        e = r["engine_fp8"]
        lines.append(f"[6] build_orpheus_backend with fp8 KV + weights: start-up + warm-up {e['build_and_warmup_s']:.1f}s, "
                     f"{e['num_pages']} {e['kv_dtype']} pages; {e['finished']}/{e['jobs']} jobs finished in {e['run_s']:.1f}s "
                     f"(least audio {e['audio_samples_min']} samples), errors {len(e['errors'])} -> {'PASS' if e['ok'] else 'FAIL'}")
    if r.get("errors"):
        lines.append("ERRORS: " + "; ".join(r["errors"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmark.gpu.fp8_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", required=True, help="path of the JSON report")
    p.add_argument("--quick", action="store_true", help="fewer batches, steps and replays")
    p.add_argument("--batches", type=list_type(number_type(int, 1)), default=None,
                   help="decode batch sizes (default 64,128,256,384,512; quick 64,256)")
    p.add_argument("--context", type=int, default=512, help="cached tokens per sequence when timing decode")
    p.add_argument("--iters", type=int, default=None, help="graph replays per timing (default 50; quick 20)")
    p.add_argument("--prompts", type=int, default=None, help="prompts in the logit check (default 8; quick 4)")
    p.add_argument("--steps", type=int, default=None, help="decode steps in the logit check (default 8; quick 4)")
    p.add_argument("--flashinfer-prefill", action="store_true",
                   help="also check FlashInfer's eager attention over fp8 pages (section 5; its fp8 "
                        "prefill kernels JIT-compile for ~1.5 min; tests/engine/llm/test_fp8.py -m gpu does too)")
    p.add_argument("--engine", action="store_true",
                   help="also start the serving path with both fp8 options and run jobs (section 6)")
    p.add_argument("--engine-jobs", type=int, default=8, help="jobs run by --engine")
    args = p.parse_args(argv)
    q = args.quick
    args.batches = args.batches or ([64, 256] if q else [64, 128, 256, 384, 512])
    args.iters = args.iters or (20 if q else 50)
    args.prompts = args.prompts or (4 if q else 8)
    args.steps = args.steps or (4 if q else 8)
    if not torch.cuda.is_available():
        p.error("no CUDA device: the fp8 check needs a GPU")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"versions": _versions(), "args": vars(args), "errors": []}
    _log(str(report["versions"]))
    models: dict[str, Any] = {}
    steps = [("models", lambda: models.update(build_models(report))),
             ("logits", lambda: check_logits(report, models, args)),
             ("decode", lambda: bench_decode(report, models, args))]
    if args.flashinfer_prefill:
        steps.append(("flashinfer_prefill", lambda: check_flashinfer_prefill(report)))
    if args.engine:
        steps.append(("engine", lambda: check_engine(report, models, args)))
    t0 = time.perf_counter()
    for name, fn in steps:
        t = time.perf_counter()
        if name != "models" and not models:
            report["errors"].append(f"{name} skipped (no models)")
            continue
        try:
            fn()
        except Exception as e:  # noqa: BLE001  (report, go on with the other sections)
            traceback.print_exc()
            report["errors"].append(f"{name} failed: {type(e).__name__}: {e}")
        report[f"{name}_s"] = time.perf_counter() - t
        report["total_s"] = time.perf_counter() - t0
        out.write_text(json.dumps(report, indent=1, default=str))
        _log(f"section {name} took {report[f'{name}_s']:.1f}s")
    print(table(report), flush=True)
    return 0 if not report["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
