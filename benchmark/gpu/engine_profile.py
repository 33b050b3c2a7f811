"""Where one engine step's time goes, phase by phase, on a real LM backend (Orpheus by default,
any ``--model`` the runtime serves; GPU machine, or ``--model tiny --device cpu`` on the CPU);
benchmark/gpu/README.md.

    python -m benchmark.gpu.engine_profile --batch 1,64,128,256 --steps 100 [--json F]
    python -m benchmark.gpu.engine_profile --model kyutai-tts --batch 64,128 --kernels 128"""

from __future__ import annotations

import argparse
import cProfile
import functools
import itertools
import json
import platform
import pstats
import statistics
import time
from collections import defaultdict
from typing import Any

from benchmark.args import list_type, number_type
from engine.llm.kernels import DECODE_ATTENTION_KERNELS, KV_WRITE_KINDS

__all__ = ["main", "measure"]

PHASES = ("schedule", "launch", "collect", "wait", "update", "audio_in", "other")
TEXT = "Hello there, this is a test of the engine on a long enough sentence to keep it busy."


def _timed(store: dict[str, float], name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            store[name] += time.perf_counter() - t0

    return wrapper


def _instrument(backend: Any) -> dict[str, float]:
    store: dict[str, float] = defaultdict(float)
    backend.scheduler.schedule = _timed(store, "schedule", backend.scheduler.schedule)
    for name in ("advance", "fill"):  # Scheduler.update is both; asynchronous steps call them apart
        setattr(backend.scheduler, name, _timed(store, "update", getattr(backend.scheduler, name)))
    launch = backend.runner.launch

    @functools.wraps(launch)
    def timed_launch(*args: Any, **kwargs: Any) -> Any:
        from engine.llm.model_runner import LaunchedStep

        t0 = time.perf_counter()
        launched = launch(*args, **kwargs)
        store["launch"] += time.perf_counter() - t0
        return LaunchedStep(_timed(store, "wait", launched), launched.tokens)

    backend.runner.launch = timed_launch
    backend._collect = _timed(store, "collect", backend._collect)
    backend._launch_audio = _timed(store, "audio_in", backend._launch_audio)
    return store


def _uninstrument(backend: Any) -> None:
    for obj, name in ((backend.scheduler, "schedule"), (backend.scheduler, "advance"), (backend.scheduler, "fill"),
                      (backend.runner, "launch"), (backend, "_collect"), (backend, "_launch_audio")):
        if name in vars(obj):
            delattr(obj, name)  # back to the class's method


def measure(backend: Any, batch: int, steps: int, *, max_tokens: int, profile: bool = False,
            sync: Any = None, prompts_per_step: int = 0, kernels: bool = False,
            text: str = TEXT) -> dict[str, Any]:
    """Keep ``batch`` jobs running (and ``prompts_per_step`` one-token jobs arriving each
    step); per-step wall time and phase medians in ms. ``kernels``: then 20 more steps under
    ``torch.profiler``, whose table of the ops with the most device time (CPU time without a
    GPU) is returned as ``kernel_table``."""
    voice, options = backend.validate(None, {"max_tokens": max_tokens, "seed": 1})
    _, one_token = backend.validate(None, {"max_tokens": 7, "seed": 2})
    one_token["max_tokens"] = 1  # (below the options' floor: the prompt's own token ends it)
    next_id = batch
    streaming = bool(getattr(backend.info, "input_streaming", False))
    for job in range(batch):
        backend.add_job(job, text, voice, options)
        if streaming:  # a turn's whole text at once, then its end
            backend.push_text(job, "", final=True)
    for _ in range(60 + batch // 16):  # admission (16 prompts a step), prefill, the ramp's frames
        backend.step()
    store = _instrument(backend)
    prof = cProfile.Profile() if profile else None
    rows: list[dict[str, float]] = []
    running: list[int] = []
    def add_prompts() -> None:
        nonlocal next_id
        for _ in range(prompts_per_step):
            backend.add_job(next_id, TEXT, voice, one_token)
            if streaming:
                backend.push_text(next_id, "", final=True)
            next_id += 1

    for _ in range(steps):
        add_prompts()
        store.clear()
        if prof:
            prof.enable()
        t0 = time.perf_counter()
        backend.step()
        total = time.perf_counter() - t0
        if prof:
            prof.disable()
        row = {name: store.get(name, 0.0) * 1e3 for name in PHASES[:-1]}
        row["other"] = total * 1e3 - sum(row.values())
        row["total"] = total * 1e3
        rows.append(row)
        running.append(backend.scheduler.num_running)
    _uninstrument(backend)
    kernel_table = None
    if kernels:
        kernel_table = _kernel_table(backend, add_prompts, sync=sync)
    for job in range(next_id):
        backend.abort_job(job)
    if sync is not None:
        sync()
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    med = {k: statistics.median(r[k] for r in rows) for k in (*PHASES, "total")}
    totals = sorted(r["total"] for r in rows)
    out_kernels = {"kernel_table": kernel_table} if kernel_table is not None else {}
    return {**out_kernels, "batch": batch, "prompts_per_step": prompts_per_step,
            "running_median": statistics.median(running),
            "steps": steps,
            "median_ms": med, "p90_total_ms": totals[int(0.9 * (len(totals) - 1))]}


def _kernel_table(backend: Any, add_prompts: Any, *, sync: Any, steps: int = 20, rows: int = 25) -> str:
    """``steps`` more engine steps under ``torch.profiler``: the ops with the most device time
    (on the CPU, CPU time), as the profiler's table."""
    from torch.profiler import ProfilerActivity, profile

    on_gpu = sync is not None
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            add_prompts()
            backend.step()
        if on_gpu:
            sync()
    key = "cuda_time_total" if on_gpu else "cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60)
    return f"{steps} steps under torch.profiler, by {key}:\n{table}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="orpheus")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=list_type(number_type(int, 1)), default=[1, 64, 128, 256])
    parser.add_argument("--steps", type=number_type(int, 5), default=100)
    parser.add_argument("--max-tokens", type=int, default=1400)
    parser.add_argument("--profile", type=int, default=0, help="cProfile the steps at this batch size")
    parser.add_argument("--kernels", type=int, default=0,
                        help="at this batch size, 20 more steps under torch.profiler: the ops with the most "
                             "device time, printed and in the JSON (where a step's time goes)")
    parser.add_argument("--async-steps", default="auto", choices=["auto", "on", "off"],
                        help="LMBackend async_steps (auto: on with CUDA graphs; the phases then overlap "
                             "differently: 'wait' is for the step launched one call earlier)")
    parser.add_argument("--prompts-per-step", type=number_type(int, 0), default=0,
                        help="fresh one-token jobs added before every measured step (default 0)")
    parser.add_argument("--mixed-graphs", default="off", choices=["on", "off", "compare"],
                        help="decode rows and fresh prompts in one CUDA graph (engine.llm.mixed_graphs); "
                             "compare: each batch with them, then without (one engine, graphs captured once)")
    parser.add_argument("--async-plan", default="on", choices=["on", "off", "compare"],
                        help="attention plans that do not wait for the step in flight (CudaGraphModelRunner; "
                             "on, as the engine's default); compare: both, one after the other on the same engine")
    parser.add_argument("--decode-attention", default="auto", choices=["auto", *DECODE_ATTENTION_KERNELS],
                        help="the decode kernel in the graphs (FlashInfer's two, or the runtime's Triton one; auto: the "
                             "model's, as voxgate serve) (fixed at capture: one per run; "
                             "benchmark.gpu.decode_attention compares the kernels alone)")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"], help="engine.llm.fp8 (CUDA)")
    parser.add_argument("--quantization", default="none", choices=["none", "fp8"], help="engine.llm.fp8 (CUDA)")
    parser.add_argument("--kv-write", default="auto", choices=["auto", *KV_WRITE_KINDS],
                        help="how keys and values are stored into the KV cache (voxgate serve --kv-write; auto: the model's)")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a model setting (voxgate serve --model-setting), repeatable")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    batches = args.batch

    import torch

    from engine.llm.attention import kv_write_kind
    from engine.llm.build import build_lm_backend
    from models.registry import load_factory, resolve

    resolved = resolve(args.model)
    if resolved.entry.kind != "lm":
        parser.error(f"--model {args.model}: not served by the LM runtime")
    backend = build_lm_backend(
        load_factory(resolved.entry), resolved.model_id, device=args.device, load_format=args.load_format,
        max_model_len=2048, max_waiting=4 * max(batches) + 4 * args.prompts_per_step,
        async_steps=args.async_steps, mixed_graphs="on" if args.mixed_graphs == "compare" else args.mixed_graphs,
        max_num_seqs=max(batches) + 2 * args.prompts_per_step + 1,
        kv_cache_dtype=args.kv_cache_dtype, quantization=args.quantization, decode_attention=args.decode_attention,
        kv_write=args.kv_write,
        **({"prefill_wait_s": 0.0, "prefill_batch_seqs": 0} if args.prompts_per_step else {}),
        **dict(kv.split("=", 1) for kv in args.setting),
    )
    # A model that takes its text while it speaks ends its turn when the text runs out: enough
    # words for the warm-up and the measured steps at any pace (Kyutai with random weights
    # spends about 8 frames a word).
    text = " ".join([TEXT] * (1 + args.steps // 25)) if backend.info.input_streaming else TEXT
    # the kernels "auto" chose (the runner's decode attention exists with CUDA graphs only)
    attention_kernel = getattr(backend.runner, "decode_attention", "none (no graphs)")
    args.decode_attention, args.kv_write = attention_kernel, kv_write_kind()
    sync = torch.cuda.synchronize if args.device == "cuda" else None
    name = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or platform.machine()
    print(f"engine step on {name}; model {args.model} ({args.load_format}); torch {torch.__version__}; "
          f"{args.prompts_per_step} fresh prompts per step; mixed graphs {args.mixed_graphs}; "
          f"async plan {args.async_plan}; decode attention {args.decode_attention}; "
          f"kv cache {args.kv_cache_dtype}, quantization {args.quantization}, kv write {args.kv_write}"
          + (f"; settings {' '.join(args.setting)}" if args.setting else ""))
    header = f"{'batch':>6} {'mixed':>5} {'plan':>5} {'running':>7} " + " ".join(f"{p:>11}" for p in PHASES) + f" {'total':>8} {'p90':>8}"
    print(header + "   (medians, ms)")
    results = []
    mixed = getattr(backend.runner, "mixed_graphs", None)
    variants = [True, False] if args.mixed_graphs == "compare" else [args.mixed_graphs == "on"]
    plans = [True, False] if args.async_plan == "compare" else [args.async_plan == "on"]
    set_plan = getattr(backend.runner, "set_async_plan", None)
    for b in batches:
        for use_mixed, use_plan in itertools.product(variants, plans):
            if hasattr(backend.runner, "mixed_graphs"):
                backend.runner.mixed_graphs = mixed if use_mixed else None
            if set_plan is not None:
                set_plan(use_plan)
            r = measure(backend, b, args.steps, max_tokens=args.max_tokens, profile=(b == args.profile), sync=sync,
                        prompts_per_step=args.prompts_per_step, kernels=(b == args.kernels), text=text)
            r["mixed_graphs"] = use_mixed and mixed is not None
            r["async_plan"] = use_plan and set_plan is not None
            results.append(r)
            m = r["median_ms"]
            print(f"{b:>6} {'on' if r['mixed_graphs'] else 'off':>5} {'on' if r['async_plan'] else 'off':>5} "
                  f"{r['running_median']:>7.0f} "
                  + " ".join(f"{m[p]:>11.2f}" for p in PHASES) + f" {m['total']:>8.2f} {r['p90_total_ms']:>8.2f}",
                  flush=True)
    for r in results:
        if "kernel_table" in r:
            print(f"\nbatch {r['batch']}, mixed graphs {'on' if r['mixed_graphs'] else 'off'}, "
                  f"async plan {'on' if r['async_plan'] else 'off'}: {r['kernel_table']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "model": args.model, "prompts_per_step": args.prompts_per_step,
                       "kv_cache_dtype": args.kv_cache_dtype, "quantization": args.quantization,
                       "mixed_graphs": args.mixed_graphs, "async_plan": args.async_plan,
                       "decode_attention": args.decode_attention, "settings": args.setting, "kv_write": args.kv_write,
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
