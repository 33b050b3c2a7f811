"""``build_orpheus_backend``: load Orpheus + SNAC and assemble an ``LMBackend`` with the
settings of an ``EngineConfig`` (or keywords), resolving the automatic defaults per device."""

from __future__ import annotations

import logging
from typing import Any

from engine.llm.backend import LMBackend
from engine.llm.model_runner import ModelRunner
from engine.llm.scheduler import Scheduler

__all__ = ["auto_decode_cap", "build_orpheus_backend"]

log = logging.getLogger(__name__)

RAMP_WINDOW_FRAMES = 4  # window decoder frames when it only serves the fast-start ramp
AUTO_DECODE_CAP_CUDA = 384  # decode rows per step by default on CUDA (scheduler.max_num_decode_seqs): 11.1-11.8 ms served on an H200 (runs 24-26)
# With fp8 weights (--quantization fp8), on H200s (docs/performance.md run 28): at cap 512, steps
# of 11.2-11.8 ms once every stream was due left new streams barely above real time, and 500
# streams underran at their start (93.4% on time; 87.2% at 512 streams in run 27); cap 448 kept
# 500-512 streams on time on one GPU and 480-576 on another; 384 rows did not cover 512 streams' demand (39.4%).
AUTO_DECODE_CAP_CUDA_FP8 = 448
AUTO_DECODE_HORIZON_S_CUDA = 1.0  # scheduler.decode_horizon_s on CUDA: = CoreConfig.lookahead_slack_s, so segments generated ahead only fill
AUTO_RAMP_STEPS_CUDA = (1024, 1536)  # ramp_step_samples: light load, under load (OrpheusProgram)
# scheduler.decode_fill_seqs: rows filled with the next deadlines while fewer are due. On an H200,
# 320 streams of 10 s over a 10 s ramp: 98.3% on time with 256 (run 17) against 78.5% with 64
# (run 16), whose small steps (about 5 ms for 64 rows) left streams a second ahead at most
AUTO_DECODE_FILL_CUDA = 256
AUTO_PREFILL_WAIT_S_CUDA = 0.05  # scheduler.prefill_wait_s: a due prompt waits at most 50 ms for company
AUTO_PREFILL_BATCH_CUDA = 8  # scheduler.prefill_batch_seqs: this many prompts go at once


def _resolve_async(value: bool | str, runner: Any) -> bool:
    """``async_steps`` from True/False or "on"/"off"/"auto" (on when the runner replays graphs)."""
    if isinstance(value, bool):
        return value
    if value not in ("auto", "on", "off"):
        raise ValueError(f"async_steps must be auto, on or off, got {value!r}")
    return value == "on" or (value == "auto" and bool(getattr(runner, "use_graphs", False)))


def _prefill_batching(wait_s: float, batch_seqs: int, runner: Any) -> tuple[float, int]:
    """``prefill_wait_s`` and ``prefill_batch_seqs``, -1 resolved: with prefill graphs the
    ``AUTO_PREFILL_*_CUDA`` values (a prompt's own replay is a pass over all the weights, so
    prompts wait to share it); with mixed graphs as well, 0 (prompts ride in the decode rows'
    pass and cost only their own tokens: waiting would only delay them); otherwise 0."""
    graphs = getattr(runner, "prefill_graphs", None) is not None
    separate = graphs and getattr(runner, "mixed_graphs", None) is None
    if wait_s < 0:
        wait_s = AUTO_PREFILL_WAIT_S_CUDA if separate else 0.0
    if batch_seqs < 0:
        batch_seqs = AUTO_PREFILL_BATCH_CUDA if separate else 0
    return wait_s, batch_seqs


def _ramp_steps(ramp_step_samples: int, device: str) -> dict[str, int | None]:
    """OrpheusProgram's ramp settings: a fixed step, or (0) the automatic pair on CUDA."""
    if ramp_step_samples:
        return {"ramp_step_samples": ramp_step_samples, "loaded_ramp_step_samples": None}
    light, loaded = AUTO_RAMP_STEPS_CUDA
    return {"ramp_step_samples": light, "loaded_ramp_step_samples": loaded if device == "cuda" else None}


def auto_decode_cap(cap: int, device: str, fp8_weights: bool) -> int:
    """``cap`` as given, or for -1 (auto) what a step keeps in real time, as measured on an
    H200 (docs/performance.md): ``AUTO_DECODE_CAP_CUDA`` on CUDA, ``AUTO_DECODE_CAP_CUDA_FP8``
    with fp8 weights, no cap (0) on the CPU."""
    if cap >= 0:
        return cap
    if device != "cuda":
        return 0
    return AUTO_DECODE_CAP_CUDA_FP8 if fp8_weights else AUTO_DECODE_CAP_CUDA


def build_orpheus_backend(
    model_path_or_id: str,
    *,
    config: Any = None,
    device: str | None = None,
    load_format: str | None = None,
    dtype: str | None = None,
    gpu_memory_utilization: float | None = None,
    max_num_seqs: int | None = None,
    max_model_len: int | None = None,
    codec_path: str | None = None,
    page_size: int = 16,
    max_num_batched_tokens: int | None = None,
    max_waiting: int = 1024,
    num_pages: int | None = None,
    cpu_kv_cache_bytes: int = 2 << 30,
    reserve_bytes: int = 2 << 30,
    stateful_codec: bool | None = None,
    codec_dtype: str | None = None,
    codec_compile: bool | None = None,
    max_num_decode_seqs: int | None = None,
    decode_horizon_s: float | None = None,
    decode_fill_seqs: int | None = None,
    prefill_wait_s: float | None = None,
    prefill_batch_seqs: int | None = None,
    hold_undue_prompts: bool | str | None = None,
    async_steps: bool | str | None = None,
    mixed_graphs: bool | str | None = None,
    async_plan: bool | str | None = None,
    decode_attention: str | None = None,
    ramp_step_samples: int | None = None,
    attention_backend_factory: Any = None,
    runner_factory: Any = None,
    warmup: bool = True,
    kv_cache_dtype: str | None = None,
    quantization: str | None = None,
) -> LMBackend:
    """Load Orpheus + SNAC and assemble an ``LMBackend``.

    Settings come from ``config`` (an ``engine.config.EngineConfig``) unless given as keywords.
    ``kv_cache_dtype`` "fp8" / ``quantization`` "fp8": the fp8 options (``engine.llm.fp8``).
    ``device`` "auto" picks CUDA when available; ``dtype`` "auto" is bf16 on CUDA, fp32 on CPU.
    KV cache: ``num_pages`` if given; on CUDA, what fits in ``total * gpu_memory_utilization``
    after the weights, minus ``reserve_bytes`` for activations and graphs; on the CPU,
    ``cpu_kv_cache_bytes``. Never more than ``max_num_seqs`` full-length sequences need, never
    less than one. One page (``runner.scratch_page``) is owned by no sequence: CUDA-graph
    padding rows write there. On CUDA with flashinfer installed the runner is
    ``CudaGraphModelRunner`` (``enable_cuda_graphs``, default) or ``ModelRunner`` with
    FlashInfer attention; ``runner_factory`` / ``attention_backend_factory`` override. ``max_num_batched_tokens`` defaults to
    ``max(512, max_num_seqs + 256)`` (every decode plus at least 256 prompt tokens). With prefill
    graphs the scheduler packs whole fresh prompts only, up to the graphs' row limit per step.
    ``stateful_codec`` (default True): SNAC decodes each frame once per stream
    (``StreamingCodecGraphs``, CUDA graphs when the window decoder is graphed too); False
    re-decodes a window per frame. ``codec_dtype`` of the stateful codec: "auto" (bf16 on CUDA,
    fp32 on the CPU), "float32" or "bfloat16"; the ramp's window decodes stay fp32.
    ``codec_compile`` (default: with CUDA graphs): the stateful codec's channels-last step
    through ``torch.compile``. ``max_num_decode_seqs``: decode rows per step, earliest
    deadlines first (``SchedulerConfig``); -1 (default) = ``AUTO_DECODE_CAP_CUDA`` on CUDA
    (``AUTO_DECODE_CAP_CUDA_FP8`` with fp8 weights), no cap on the CPU. ``decode_horizon_s`` / ``decode_fill_seqs``: decode only jobs due within the
    horizon, filling up to that many rows (``SchedulerConfig``); -1 (default) =
    ``AUTO_DECODE_HORIZON_S_CUDA`` / ``AUTO_DECODE_FILL_CUDA`` on CUDA, off on the CPU.
    ``prefill_wait_s`` / ``prefill_batch_seqs``: under load, fresh prompts wait that long (once
    due) for that many to share one prefill pass (``SchedulerConfig``); -1 (default) =
    ``AUTO_PREFILL_WAIT_S_CUDA`` / ``AUTO_PREFILL_BATCH_CUDA`` with prefill graphs, off otherwise
    and with mixed graphs (``_prefill_batching``). ``hold_undue_prompts`` (True / "on"; default
    off): under load, prompts not due within the horizon wait (``SchedulerConfig``).
    ``async_steps``: launch each step before the previous one's tokens reach the host
    (``LMBackend``): True / "on", False / "off", or "auto" (default): on when the runner replays
    CUDA graphs.
    ``mixed_graphs``: "on" / True captures ``MixedGraphs`` (decode rows and fresh prompts in one
    replay) with the CUDA-graph runner; "off" (default).
    ``async_plan``: "on" / True: the CUDA-graph runner's attention plans do not wait for the step
    in flight (``CudaGraphModelRunner``; default); "off": they wait for it.
    ``decode_attention``: FlashInfer's decode kernel in the graphs, "cuda-cores" (default) or
    "tensor-cores" (``CudaGraphModelRunner``).
    ``ramp_step_samples``: the fast-start ramp's lookahead growth per frame
    (``models.orpheus.codec.StreamingDecoder``); 0 (default) = ``AUTO_RAMP_STEPS_CUDA`` on CUDA
    (the second one for segments that start under load, ``OrpheusProgram``), 1024 on the CPU.
    """
    import functools
    import importlib.util

    import torch

    from engine.llm.model_runner import kv_bytes_per_page, num_pages_for_memory
    from engine.llm.page_allocator import PageAllocator
    from models.orpheus.program import OrpheusProgram
    from engine.llm.scheduler import SchedulerConfig
    from models.orpheus.codec import SnacDecoder
    from models.orpheus.loader import SNAC_HUB_ID, load_orpheus, load_snac

    def pick(value: Any, name: str, default: Any) -> Any:
        if value is not None:
            return value
        return getattr(config, name, default) if config is not None else default

    device = pick(device, "device", "auto")
    load_format = pick(load_format, "load_format", "auto")
    dtype_name = pick(dtype, "dtype", "auto")
    utilization = pick(gpu_memory_utilization, "gpu_memory_utilization", 0.85)
    max_num_seqs = pick(max_num_seqs, "max_num_seqs", 256)
    max_model_len = pick(max_model_len, "max_model_len", 2048)
    codec_path = pick(codec_path, "codec_path", None) or SNAC_HUB_ID
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch sees no CUDA GPU")
    if dtype_name == "auto":
        dtype_name = "bfloat16" if device == "cuda" else "float32"
    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype_name]
    from engine.llm.fp8 import quantise_decoder_linears_, resolve_fp8_options

    # fp8 options (engine.llm.fp8): CUDA + bf16 only, refused here at start-up otherwise.
    kv_dtype, quantise_fp8 = resolve_fp8_options(
        pick(kv_cache_dtype, "kv_cache_dtype", "auto"), pick(quantization, "quantization", "none"),
        device=device, dtype=torch_dtype,
    )

    model, tokenizer, llama_config = load_orpheus(
        model_path_or_id, device=device, dtype=torch_dtype, load_format=load_format, max_seq_len=max_model_len
    )
    if quantise_fp8:
        quantise_decoder_linears_(model)  # before any runner builds its fused forward
    codec = SnacDecoder(load_snac(codec_path, device=device, load_format=load_format)).to(device)
    decode_fn = None
    decode_fn_enabled = (device == "cuda" and pick(None, "enable_cuda_graphs", True)
                         and importlib.util.find_spec("flashinfer") is not None)

    use_stateful = pick(stateful_codec, "stateful_codec", True)
    # With the stateful codec the window decoder only serves the fast-start ramp (frames 1-4,
    # all of them from the stream's start), so 4-frame windows suffice: a third less work.
    window_frames = RAMP_WINDOW_FRAMES if use_stateful else None
    if decode_fn_enabled:
        from models.orpheus.codec_graphs import make_graph_decode_fn

        decode_fn = make_graph_decode_fn(codec, window_frames=window_frames)  # all streams' windows, one replay
    stream_codec = None
    if use_stateful:  # each frame through SNAC once (engine.llm.program)
        from models.orpheus.codec_stream_graphs import StreamingCodecGraphs
        from models.orpheus.snac_stream import StreamingSnac

        codec_dtype_name = pick(codec_dtype, "codec_dtype", "auto")
        if codec_dtype_name not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"codec_dtype must be auto, float32 or bfloat16, got {codec_dtype_name!r}")
        if codec_dtype_name == "auto":
            codec_dtype_name = "bfloat16" if device == "cuda" else "float32"
        # torch.compile'd channels-last step on CUDA graphs: 1.14 ms for 64 rows in bf16 on the
        # H200 vs 4.22 ms for the plain NCW layers (benchmark.codec_stream --compare); ~40 s of
        # compilation at start-up.
        compiled = pick(codec_compile, "codec_compile", decode_fn is not None)
        stream_codec = StreamingCodecGraphs(
            StreamingSnac(codec, max_streams=max_num_seqs, device=device, dtype=getattr(torch, codec_dtype_name),
                          channels_last=compiled, compile=compiled),
            capture=decode_fn is not None)
    program = OrpheusProgram(tokenizer, codec, model_name=str(model_path_or_id), decode_fn=decode_fn,
                             stream_codec=stream_codec, window_frames=window_frames,
                             **_ramp_steps(pick(ramp_step_samples, "ramp_step_samples", 0), device))

    pages_per_seq = -(-max_model_len // page_size)
    if num_pages is None:
        if device == "cuda":
            num_pages = num_pages_for_memory(
                llama_config, page_size=page_size, dtype=kv_dtype, device=torch.device(device),
                gpu_memory_utilization=utilization, reserve_bytes=reserve_bytes,
            )
        else:
            num_pages = cpu_kv_cache_bytes // kv_bytes_per_page(llama_config, page_size, kv_dtype)
        num_pages = min(num_pages, max_num_seqs * pages_per_seq + 1)
    if num_pages - 1 < pages_per_seq:  # (one page may become the scratch page)
        raise ValueError(
            f"the KV cache ({num_pages} pages of {page_size}) cannot hold one sequence of "
            f"max_model_len={max_model_len}; lower max_model_len or give it more memory"
        )
    decode_cap = auto_decode_cap(pick(max_num_decode_seqs, "max_num_decode_seqs", -1), device, quantise_fp8)
    if runner_factory is None and device == "cuda":
        from engine.llm.cuda_graphs import CudaGraphModelRunner, flashinfer_attention_factory

        if importlib.util.find_spec("flashinfer") is None:
            log.warning("flashinfer is not installed: plain torch paged attention, no CUDA graphs")
        elif pick(None, "enable_cuda_graphs", True):
            from engine.llm.mixed_graphs import mixed_decode_buckets

            mixed = pick(mixed_graphs, "mixed_graphs", "off")
            from models.orpheus.fused_forward import FusedLlamaForward

            runner_factory = functools.partial(CudaGraphModelRunner, max_model_len=max_model_len,
                                               graph_forward=FusedLlamaForward.for_model(model),
                                               mixed=mixed in (True, "on"),
                                               mixed_decode_buckets=mixed_decode_buckets(decode_cap),
                                               async_plan=pick(async_plan, "async_plan", "on") in (True, "on"),
                                               decode_attention=pick(decode_attention, "decode_attention", "cuda-cores"))
        else:
            attention_backend_factory = attention_backend_factory or flashinfer_attention_factory
    runner_kw: dict[str, Any] = {}
    if attention_backend_factory is not None:
        runner_kw["attention_backend_factory"] = attention_backend_factory
    if kv_dtype != torch_dtype:
        runner_kw["kv_cache_dtype"] = kv_dtype
    runner = (runner_factory or ModelRunner)(
        model, llama_config, device=device, dtype=torch_dtype, num_pages=num_pages, page_size=page_size,
        max_num_seqs=max_num_seqs, vocab_ids=program.vocab_ids, allowed_table=program.allowed_table,
        **runner_kw,
    )
    allocator_pages = num_pages
    if runner.scratch_page is None:  # keep the last page out of the allocator's range
        allocator_pages = num_pages - 1
        runner.scratch_page = allocator_pages
    prefill_graphs = getattr(runner, "prefill_graphs", None)
    horizon = pick(decode_horizon_s, "decode_horizon_s", -1.0)
    if horizon < 0:
        horizon = AUTO_DECODE_HORIZON_S_CUDA if device == "cuda" else 0.0
    fill = pick(decode_fill_seqs, "decode_fill_seqs", -1)
    if fill < 0:
        fill = AUTO_DECODE_FILL_CUDA if device == "cuda" else 0
    prefill_wait, prefill_batch = _prefill_batching(pick(prefill_wait_s, "prefill_wait_s", -1.0),
                                                    pick(prefill_batch_seqs, "prefill_batch_seqs", -1), runner)
    scheduler = Scheduler(
        SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens or max(512, max_num_seqs + 256),
            max_model_len=max_model_len,
            max_waiting=max_waiting,
            # whole fresh prompts, as many as one packed prefill graph holds
            max_num_prefill_seqs=prefill_graphs.max_num_seqs if prefill_graphs is not None else 0,
            max_num_prefill_tokens=prefill_graphs.max_num_tokens if prefill_graphs is not None else 0,
            max_num_decode_seqs=decode_cap,
            decode_horizon_s=horizon,
            decode_fill_seqs=fill,
            prefill_wait_s=prefill_wait,
            prefill_batch_seqs=prefill_batch,
            hold_undue_prompts=pick(hold_undue_prompts, "hold_undue_prompts", "off") in (True, "on"),
            whole_prompts=prefill_graphs is not None,
        ),
        PageAllocator(allocator_pages, page_size),
    )
    backend = LMBackend(program, runner, scheduler,
                        async_steps=_resolve_async(pick(async_steps, "async_steps", "auto"), runner))
    if warmup:
        backend.warmup()
    return backend
