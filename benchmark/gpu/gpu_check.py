"""The Orpheus engine on one GPU: the GPU path against the CPU path on a tiny checkpoint, then step
time, time to first audio and codec time at Orpheus-3B size (benchmark/gpu/README.md).

    python -m benchmark.gpu.gpu_check --out OUT [--skip-full]"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmark.args import list_type, number_type
from engine.llm.attention import build_attention_metadata
from engine.llm.cuda_graphs import BatchGraphs, CudaGraphModelRunner
from engine.llm.model_runner import ModelRunner
from engine.llm.scheduler import ScheduledBatch
from engine.llm.sequence import SamplingParams, Sequence
from models.orpheus.config import TINY
from models.orpheus.llama import LlamaModel

__all__ = ["main"]

PAGE = 16
BF16_REL_TOL = 3e-2  # ||gpu - cpu|| / ||cpu|| for bf16 weights, activations and KV cache
GRAPH_REL_TOL = 1e-2  # graph replay vs eager, same dtype (split-KV order may differ)
AUDIO_BASE, NUM_AUDIO_IDS, STOP_ID = 128266, 7 * 4096, 128258


def _fused(model: torch.nn.Module, args: argparse.Namespace):
    """The fused forward the Orpheus program serves with, or None (``--no-fused``: the model's own)."""
    if not args.fused:
        return None
    from models.orpheus.fused_forward import FusedLlamaForward

    return FusedLlamaForward.for_model(model, rope="triton")  # (the served default with CUDA graphs)


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _rel(a: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    a, ref = a.double().cpu(), ref.double().cpu()
    if not torch.isfinite(a).all():
        return float("nan"), float("nan")
    return float((a - ref).abs().max()), float((a - ref).norm() / ref.norm())


class _Pages:
    """Hands out consecutive page ids (the check never frees)."""

    def __init__(self) -> None:
        self.next = 0

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        while len(seq.pages) * PAGE < num_tokens:
            seq.pages.append(self.next)
            self.next += 1


def _batch(seqs: list[Sequence], new: list[int], num_decode: int) -> ScheduledBatch:
    return ScheduledBatch(seqs=seqs, num_new_tokens=new, is_sampled=[True] * len(seqs), num_decode_seqs=num_decode)


def _inputs(batch: ScheduledBatch) -> torch.Tensor:
    return torch.tensor(
        [t for s, n in zip(batch.seqs, batch.num_new_tokens)
         for t in s.token_slice(s.num_computed_tokens, s.num_computed_tokens + n)],
        dtype=torch.int64,
    )


# -- 1. correctness ----------------------------------------------------------------------------


def check_tiny(report: dict[str, Any]) -> None:
    """GPU bf16 FlashInfer (eager and graph) vs CPU fp32 torch attention on a tiny checkpoint."""
    cfg = TINY.with_(hidden_size=256, intermediate_size=512, num_attention_heads=6,
                     num_key_value_heads=2, head_dim=128, num_hidden_layers=2)
    torch.manual_seed(0)
    cpu_model = LlamaModel(cfg, max_seq_len=1024).init_random_(seed=1).eval()
    gpu_model = copy.deepcopy(cpu_model).to("cuda", torch.bfloat16)
    gpu_model.setup_rope("cuda")
    common = dict(num_pages=128, max_num_seqs=8)
    cpu = ModelRunner(cpu_model, cfg, device="cpu", dtype=torch.float32, **common)
    gpu = CudaGraphModelRunner(gpu_model, cfg, device="cuda", dtype=torch.bfloat16, max_model_len=1024,
                               decode_buckets=(1, 2, 4, 8), progress=False, **common)
    pages = _Pages()
    gen = torch.Generator().manual_seed(2)
    params = SamplingParams(temperature=0.0)

    def new_seq(i: int, n: int) -> Sequence:
        ids = torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()
        return Sequence(seq_id=i, prompt_ids=ids, params=params, slot=i)

    seqs = [new_seq(0, 37), new_seq(1, 5), new_seq(2, 70)]
    plan: list[tuple[str, list[Sequence], int]] = [("prefill x3", seqs, 0)]
    plan += [(f"decode x3 #{i}", seqs, 3) for i in range(6)]
    late = new_seq(3, 23)
    plan += [("mixed 3 decode + 1 prefill", seqs + [late], 3)]
    plan += [(f"decode x4 #{i}", seqs + [late], 4) for i in range(5)]

    rows = []
    worst, worst_graph = 0.0, 0.0
    for name, batch_seqs, nd in plan:
        new = [1 if i < nd else s.num_uncomputed_tokens for i, s in enumerate(batch_seqs)]
        for s, n in zip(batch_seqs, new):
            pages.grow(s, s.num_computed_tokens + n)
        batch = _batch(batch_seqs, new, nd)
        meta = build_attention_metadata(batch, PAGE)
        ids = _inputs(batch)
        with torch.inference_mode():
            ref = cpu._forward(ids, meta)  # [B, V] float32
            eager = gpu._forward(ids, meta).float()
            row = {"step": name}
            row["max_abs"], row["rel"] = _rel(eager, ref)
            row["top1_agree"] = float((eager.cpu().argmax(-1) == ref.argmax(-1)).float().mean())
            worst = max(worst, row["rel"]) if row["rel"] == row["rel"] else float("inf")
            if nd == len(batch_seqs):
                g_ids, *extras = gpu.graph_inputs(batch)
                _, graph = gpu.graphs.run(g_ids, meta, *extras)
                row["graph_max_abs"], row["graph_rel"] = _rel(graph, eager)
                row["graph_top1_equal"] = bool((graph.argmax(-1) == eager.argmax(-1)).all())
                worst_graph = max(worst_graph, row["graph_rel"])
        rows.append(row)
        _log(f"tiny {name}: {row}")
        tokens = ref.argmax(-1).tolist()  # greedy from the reference keeps both paths' inputs equal
        for s, n, t in zip(batch_seqs, new, tokens):
            s.num_computed_tokens += n
            s.output_ids.append(t)
    # One fresh prompt alone in its step: the prefill graph (SDPA) against eager FlashInfer and CPU.
    solo = new_seq(7, 29)
    solo.slot = 5
    pages.grow(solo, 29)
    batch = _batch([solo], [29], 0)
    meta = build_attention_metadata(batch, PAGE)
    ids = _inputs(batch)
    with torch.inference_mode():
        ref = cpu._forward(ids, meta)
        eager = gpu._forward(ids, meta).float()
        _, *extras = gpu.graph_inputs(batch)
        _, graph = gpu.prefill_graphs.run(ids, meta.slot_mapping, *extras)
    row = {"step": "single prompt prefill: graph"}
    row["max_abs"], row["rel"] = _rel(graph, ref)
    row["eager_rel"] = _rel(eager, ref)[1]
    row["graph_vs_eager_rel"] = _rel(graph, eager)[1]
    row["top1_agree"] = float((graph.cpu().argmax(-1) == ref.argmax(-1)).float().mean())
    worst = max(worst, row["rel"]) if row["rel"] == row["rel"] else float("inf")
    rows.append(row)
    _log(f"tiny {row['step']}: {row}")
    report["tiny_steps"] = rows
    report["tiny_worst_rel"] = worst
    report["tiny_worst_graph_rel"] = worst_graph
    report["tiny_pass"] = worst < BF16_REL_TOL and worst_graph < GRAPH_REL_TOL


def check_codec_graph(report: dict[str, Any]) -> None:
    """The product codec (``SnacDecoder.decode_windows``) as a CUDA graph equals eager."""
    dec = _codec(torch.float32)
    graphs = _codec_graphs(dec, frames=6, buckets=(1, 4), progress=False)
    inputs = _window_inputs(3, 6)
    inputs[4][0] = 2  # a first window: frames before 2 are padding
    eager = dec.decode_windows(*inputs)
    (graph,) = graphs.run(*inputs)
    report["codec_graph_max_abs"], report["codec_graph_rel"] = _rel(graph, eager)
    report["codec_graph_pass"] = report["codec_graph_rel"] < 1e-4
    _log(f"codec graph vs eager: max_abs {report['codec_graph_max_abs']:.3g} rel {report['codec_graph_rel']:.3g}")


# -- 2. figures at full size -------------------------------------------------------------------


def _codec(dtype: torch.dtype) -> Any:
    from models.orpheus.codec import SnacDecoder
    from models.orpheus.loader import load_snac

    return SnacDecoder(load_snac(load_format="dummy", device="cuda")).to(dtype).eval()


def _window_inputs(batch: int, frames: int) -> list[torch.Tensor]:
    """decode_windows inputs: codes [B, W], [B, 2W], [B, 4W], start/valid_from/valid_to [B]."""
    codes = [torch.randint(0, 4096, (batch, frames * m), device="cuda") for m in (1, 2, 4)]
    start = torch.randint(0, 500, (batch,), device="cuda")
    return [*codes, start, torch.zeros(batch, dtype=torch.int64, device="cuda"),
            torch.full((batch,), frames, dtype=torch.int64, device="cuda")]


def _codec_graphs(dec: Any, *, frames: int, buckets: tuple[int, ...], progress: bool) -> BatchGraphs:
    specs = [((frames * m,), torch.int64) for m in (1, 2, 4)] + [((), torch.int64)] * 3
    g = BatchGraphs(dec.decode_windows, specs, buckets=buckets, device=next(dec.parameters()).device)
    g.capture(progress=progress, desc=f"SNAC graphs ({frames} frames)")
    return g


def _median_ms(fn: Callable[[], None], iters: int, *, events: bool) -> float:
    times = []
    for _ in range(iters):
        if events:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def _decode_batch(runner: ModelRunner, n: int, context: int, first_page: int) -> ScheduledBatch:
    """``n`` sequences with ``context`` cached tokens each (random K/V), one new token."""
    seqs = []
    per = -(-(context + 1) // PAGE)
    for i in range(n):
        s = Sequence(seq_id=i, prompt_ids=[AUDIO_BASE + (i % 4096)] * context, params=SamplingParams(seed=i), slot=i)
        s.output_ids.append(AUDIO_BASE + 7)
        s.num_computed_tokens = context
        s.pages = list(range(first_page + i * per, first_page + (i + 1) * per))
        seqs.append(s)
    return _batch(seqs, [1] * n, n)


def bench_full(report: dict[str, Any], args: argparse.Namespace) -> None:
    from models.orpheus.loader import load_orpheus

    t = time.perf_counter()
    model, _tok, cfg = load_orpheus("orpheus-3b", device="cuda", dtype=torch.bfloat16, load_format="dummy",
                                    max_seq_len=4096)
    torch.cuda.synchronize()
    report["load_dummy_s"] = time.perf_counter() - t
    batches = args.batches
    per = -(-(args.context + 1) // PAGE)
    num_pages = max(batches) * per + 256
    t = time.perf_counter()
    runner = CudaGraphModelRunner(model, cfg, device="cuda", dtype=torch.bfloat16, num_pages=num_pages,
                                  max_model_len=4096, max_num_seqs=512, capture=False, graph_forward=_fused(model, args))
    for cache in runner.kv_caches:
        cache.normal_()  # random K/V: never time on zeros
    runner.capture(progress=True)
    report["capture_decode_graphs_s"] = time.perf_counter() - t
    report["kv_pages"] = num_pages
    _log(f"runner ready: {num_pages} pages, graphs {runner.graphs.buckets} in {report['capture_decode_graphs_s']:.1f}s")

    # The program's head: only the audio ids and the stop id (what serving Orpheus uses).
    audio_ids = torch.tensor([*range(AUDIO_BASE, AUDIO_BASE + NUM_AUDIO_IDS), STOP_ID])
    audio = CudaGraphModelRunner(model, cfg, device="cuda", dtype=torch.bfloat16, num_pages=num_pages,
                                 max_model_len=4096, max_num_seqs=512, vocab_ids=audio_ids, capture=False,
                                 decode_buckets=batches, graph_forward=_fused(model, args))
    for cache in audio.kv_caches:
        cache.normal_()
    audio.capture(progress=True)

    rows = []
    for b in batches:
        row = {"batch": b, "context": args.context}
        for name, r in (("full_head", runner), ("audio_head", audio)):
            batch = _decode_batch(r, b, args.context, 0)
            r.execute(batch)  # plans this batch's graph
            g = r.graphs._graphs[b].graph
            row[f"{name}_graph_ms"] = _median_ms(g.replay, args.iters, events=True)
            row[f"{name}_execute_ms"] = _median_ms(lambda: r.execute(batch), args.iters, events=False)
        rows.append(row)
        _log(f"decode {row}")
    report["decode"] = rows
    del audio
    torch.cuda.empty_cache()

    # Single-stream time to first audio: prefill (eager FlashInfer) + decode steps (graphs) for
    # the frames the streaming decoder needs + SNAC on the first window (graph), as the engine
    # does it (one host sync per step to read the token).
    from models.orpheus.codec import StreamingDecoder

    dec = _codec(torch.float32)
    win = StreamingDecoder(None).window_frames
    codec1 = _codec_graphs(dec, frames=win, buckets=(1,), progress=False)
    report["ttfa"] = []
    for lookahead in args.ttfa_lookahead:
        _ttfa(report, args, runner, dec, codec1, win, lookahead, per * max(batches))
    del runner
    torch.cuda.empty_cache()


def _ttfa(report: dict[str, Any], args: argparse.Namespace, runner: Any, dec: Any, codec1: BatchGraphs,
          win: int, lookahead: int, first_page: int) -> None:
    from models.orpheus.codec import StreamingDecoder, decode_requests

    ttfa, prefill_ms, frames_used = [], [], 0
    for r in range(args.ttfa_runs):
        seq = Sequence(seq_id=10_000 + r, prompt_ids=[128259, 128000, *range(1000, 1000 + args.prompt_tokens),
                                                      128009, 128260, 128261, 128257],
                       params=SamplingParams(seed=r), slot=0)
        seq.pages = list(range(first_page, first_page + 64))
        stream = StreamingDecoder(None, window_frames=win, lookahead_samples=lookahead)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tok = runner.execute(_batch([seq], [seq.num_prompt_tokens], 0))
        prefill_ms.append((time.perf_counter() - t0) * 1e3)
        seq.num_computed_tokens = seq.num_prompt_tokens
        seq.output_ids.append(int(tok[0]))
        req = None
        while req is None:
            if len(seq.output_ids) % 7 == 0:  # a frame is complete (stand-in codes: token mod 4096)
                req = stream.push_frame([t % 4096 for t in seq.output_ids[-7:]])
                if req is not None:
                    break
            tok = runner.execute(_batch([seq], [1], 1))
            seq.num_computed_tokens += 1
            seq.output_ids.append(int(tok[0]))
        if args.ttfa_eager_codec:
            pcm = decode_requests(dec, [req])[0]
        else:
            from models.orpheus.tokens import frames_to_codes

            c0, c1, c2 = frames_to_codes(req.frames[None].to("cuda"))
            dev = torch.device("cuda")
            aux = [torch.tensor([v], device=dev) for v in (req.start_frame, req.valid_from, req.valid_to)]
            (audio,) = codec1.run(c0, c1, c2, *aux)
            pcm = audio[0, req.emit_from:req.emit_to].cpu().numpy()
        ttfa.append((time.perf_counter() - t0) * 1e3)
        frames_used = stream.num_frames
        assert pcm.size > 0
    ttfa.sort()
    row = {"frames": frames_used, "window_frames": win, "lookahead_samples": lookahead,
           "prompt_tokens": seq.num_prompt_tokens, "runs": len(ttfa), "p50_ms": statistics.median(ttfa),
           "p90_ms": ttfa[int(0.9 * (len(ttfa) - 1))], "prefill_p50_ms": statistics.median(prefill_ms)}
    report["ttfa"].append(row)
    _log(f"ttfa {row}")


_TEXT = ("On the third of May, at half past nine, the ferry left the harbour with forty-two passengers, "
         "a crate of oranges and one very patient dog; nobody expected the storm that followed, "
         "least of all the captain.")


def bench_engine_ttfa(report: dict[str, Any], args: argparse.Namespace) -> None:
    """Time to first audio through the real ``LMBackend`` (scheduler, runner, program, codec)."""
    from functools import partial

    from models.orpheus.build import build_orpheus_backend

    backend = build_orpheus_backend(
        args.engine_model, device="cuda", load_format="dummy", max_num_seqs=64, max_model_len=2048,
        num_pages=2048, runner_factory=partial(CudaGraphModelRunner, max_model_len=2048), warmup=True,
    )
    report["engine_ttfa"] = _engine_ttfa(backend, args, "eager codec")
    from models.orpheus.codec_graphs import make_graph_decode_fn

    backend.program.decode_fn = make_graph_decode_fn(backend.program.codec, progress=False)
    report["engine_ttfa_codec_graph"] = _engine_ttfa(backend, args, "codec graph")
    backend.close()


def _engine_ttfa(backend: Any, args: argparse.Namespace, label: str) -> dict[str, Any]:
    ttfa = []
    for r in range(args.ttfa_runs):
        voice, opts = backend.validate(None, {"seed": r})
        t0 = time.perf_counter()
        backend.add_job(r, _TEXT, voice, opts)
        got = False
        while not got:
            outs = backend.step()
            if any(o.error is not None for o in outs):
                raise RuntimeError(f"engine error: {[o.error for o in outs if o.error]}")
            got = any(o.job_id == r and o.pcm is not None and o.pcm.size > 0 for o in outs)
            if not got and any(o.job_id == r and o.is_finished for o in outs):
                raise RuntimeError("a job finished without audio")
        ttfa.append((time.perf_counter() - t0) * 1e3)
        backend.abort_job(r)
        while backend.has_work():
            backend.step()
    prompt = len(backend.program.build_prompt(_TEXT, voice, opts))
    ttfa.sort()
    row = {"codec": label, "runs": len(ttfa), "prompt_tokens": prompt, "words": len(_TEXT.split()),
           "p50_ms": statistics.median(ttfa), "p90_ms": ttfa[int(0.9 * (len(ttfa) - 1))]}
    _log(f"engine ttfa {row}")
    return row


def profile_decode(report: dict[str, Any], args: argparse.Namespace) -> None:
    """Kernel-time breakdown of one graphed decode step (audio head) at ``--profile-batch``."""
    from torch.profiler import ProfilerActivity, profile

    from models.orpheus.loader import load_orpheus

    model, _tok, cfg = load_orpheus("orpheus-3b", device="cuda", dtype=torch.bfloat16, load_format="dummy",
                                    max_seq_len=4096)
    b = args.profile_batch
    per = -(-(args.context + 1) // PAGE)
    audio_ids = torch.tensor([*range(AUDIO_BASE, AUDIO_BASE + NUM_AUDIO_IDS), STOP_ID])
    runner = CudaGraphModelRunner(model, cfg, device="cuda", dtype=torch.bfloat16, num_pages=b * per + 16,
                                  max_model_len=4096, max_num_seqs=b, vocab_ids=audio_ids, decode_buckets=(b,),
                                  prefill_buckets=(), progress=False)
    for cache in runner.kv_caches:
        cache.normal_()
    batch = _decode_batch(runner, b, args.context, 0)
    runner.execute(batch)
    g = runner.graphs._graphs[b].graph
    reps = 20
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            g.replay()
        torch.cuda.synchronize()
    try:
        table = prof.key_averages().table(sort_by="device_time_total", row_limit=30, max_name_column_width=70)
    except Exception:  # noqa: BLE001  (older name of the same column)
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70)
    out = Path(args.out) / f"profile_b{b}.txt"
    out.write_text(f"{reps} replays of the batch-{b} decode graph (audio head), times summed over replays\n{table}")
    report["profile_file"] = str(out)
    print(table, flush=True)


def bench_codec(report: dict[str, Any], args: argparse.Namespace) -> None:
    """Product codec: one ``--codec-frames``-frame window per row, eager fp32 and graphs fp32/bf16."""
    frames = args.codec_frames
    batches = (1, 16, 64)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        dec = _codec(dtype)
        graphs = _codec_graphs(dec, frames=frames, buckets=batches, progress=False)
        for b in batches:
            inputs = _window_inputs(b, frames)
            eager = None
            if dtype == torch.float32:
                eager = _median_ms(lambda: dec.decode_windows(*inputs), 20, events=True)
            graphs.run(*inputs)
            g = graphs._graphs[b][0]
            row = {"dtype": str(dtype).removeprefix("torch."), "batch": b, "frames": frames,
                   "eager_ms": eager, "graph_ms": _median_ms(g.replay, 50, events=True)}
            rows.append(row)
            _log(f"codec {row}")
        graphs = dec = None  # free both before the next dtype's
    report["codec"] = rows


# -- driver ------------------------------------------------------------------------------------


def _versions() -> dict[str, str]:
    v = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": str(torch.version.cuda)}
    try:
        import flashinfer

        v["flashinfer"] = flashinfer.__version__
    except Exception as e:  # noqa: BLE001
        v["flashinfer"] = f"unavailable: {e}"
    if torch.cuda.is_available():
        v["gpu"] = torch.cuda.get_device_name()
    return v


def _table(r: dict[str, Any]) -> str:
    v = r["versions"]
    lines = [f"GPU {v.get('gpu')} | torch {v['torch']} (CUDA {v['cuda']}) | flashinfer {v['flashinfer']}", ""]
    if "tiny_pass" in r:
        lines.append(f"tiny GPU bf16 vs CPU fp32 logits: worst rel {r['tiny_worst_rel']:.2e} (tol {BF16_REL_TOL}); "
                     f"graph vs eager worst rel {r['tiny_worst_graph_rel']:.2e} -> {'PASS' if r['tiny_pass'] else 'FAIL'}")
    if "codec_graph_pass" in r:
        lines.append(f"SNAC graph vs eager: rel {r['codec_graph_rel']:.2e} -> {'PASS' if r['codec_graph_pass'] else 'FAIL'}")
    if "decode" in r:
        lines.append("")
        lines.append("decode step (whole step in one graph: forward, head, sampler), ms")
        lines.append("batch | ctx | full head: graph | full head: execute | audio head: graph | audio head: execute")
        for d in r["decode"]:
            lines.append(f"{d['batch']:5d} | {d['context']} | {d['full_head_graph_ms']:.2f} | {d['full_head_execute_ms']:.2f} | "
                         f"{d['audio_head_graph_ms']:.2f} | {d['audio_head_execute_ms']:.2f}")
    for t in r.get("ttfa", []):
        lines.append(f"single-stream TTFA, harness (lookahead {t['lookahead_samples']}: first PCM after {t['frames']} frames, "
                     f"{t['window_frames']}-frame window, {t['prompt_tokens']}-token prompt, {t['runs']} runs): "
                     f"p50 {t['p50_ms']:.1f} ms, p90 {t['p90_ms']:.1f} ms (prefill {t['prefill_p50_ms']:.1f} ms); target <= 50 ms")
    for key in ("engine_ttfa", "engine_ttfa_codec_graph"):
        if key in r:
            t = r[key]
            lines.append(f"LMBackend TTFA, {t['codec']} (add_job -> first PCM, {t['words']} words = {t['prompt_tokens']} "
                         f"prompt tokens, {t['runs']} runs): p50 {t['p50_ms']:.1f} ms, p90 {t['p90_ms']:.1f} ms; target <= 50 ms")
    if "codec" in r:
        lines.append("\ncodec dtype | batch | frames | eager ms | graph ms")
        for c in r["codec"]:
            e = "-" if c["eager_ms"] is None else f"{c['eager_ms']:.2f}"
            lines.append(f"{c['dtype']} | {c['batch']} | {c['frames']} | {e} | {c['graph_ms']:.2f}")
    if r.get("errors"):
        lines.append("\nERRORS: " + "; ".join(r["errors"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmark.gpu.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "gpu_check_out"), help="folder for gpu_check.json")
    p.add_argument("--skip-full", action="store_true", help="only the tiny correctness checks")
    p.add_argument("--batches", type=list_type(number_type(int, 1)), default=[1, 8, 64, 256],
                   help="decode batch sizes to time")
    p.add_argument("--context", type=int, default=512, help="cached tokens per sequence when timing decode")
    p.add_argument("--iters", type=int, default=100, help="replays per timing (median)")
    p.add_argument("--ttfa-lookahead", type=list_type(number_type(int, 0)), default=[5120, 1024],
                   help="StreamingDecoder lookaheads (samples) to time")
    p.add_argument("--no-fused", dest="fused", action="store_false", help="the model's own forward, not the fused one")
    p.add_argument("--ttfa-eager-codec", action="store_true", help="decode the first window eagerly")
    p.add_argument("--ttfa-runs", type=int, default=20)
    p.add_argument("--profile-batch", type=int, default=0, help="profile the decode graph at this batch (0: no)")
    p.add_argument("--engine-model", default="orpheus-3b", help="dummy preset for the LMBackend TTFA")
    p.add_argument("--prompt-tokens", type=int, default=56, help="text tokens in the TTFA prompt (~40 words)")
    p.add_argument("--codec-frames", type=int, default=6, help="frames per codec window (StreamingDecoder's)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check", file=sys.stderr)
        return 2
    report: dict[str, Any] = {"versions": _versions(), "errors": []}
    _log(str(report["versions"]))
    steps: list[tuple[str, Callable[[], None]]] = [
        ("tiny", lambda: check_tiny(report)),
        ("codec_graph", lambda: check_codec_graph(report)),
    ]
    if not args.skip_full:
        if args.profile_batch:
            steps += [("profile", lambda: profile_decode(report, args))]
        steps += [("full", lambda: bench_full(report, args)),
                  ("engine_ttfa", lambda: bench_engine_ttfa(report, args)),
                  ("codec", lambda: bench_codec(report, args))]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, fn in steps:
        t = time.perf_counter()
        try:
            fn()
        except Exception:  # noqa: BLE001  (report and go on with the other sections)
            traceback.print_exc()
            report["errors"].append(f"{name} failed")
        _log(f"section {name} took {time.perf_counter() - t:.1f}s")
        (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    print(_table(report), flush=True)
    ok = report.get("tiny_pass") and report.get("codec_graph_pass", True) and not report["errors"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
