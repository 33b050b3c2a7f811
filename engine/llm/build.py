"""``build_lm_backend``: load a program (``models/<name>``) and assemble an ``LMBackend`` around it.

Resolves device and dtype, calls the program's ``load``, sizes the paged KV cache, picks the
runner, configures the scheduler and warms up; nothing here knows which model it builds.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
from collections.abc import Callable, Sequence
from typing import Any

from engine.llm.backend import LMBackend
from engine.llm.kernels import check_kernel, resolve_kernel
from engine.llm.model_runner import ModelRunner
from engine.llm.program import DEFAULT_MAX_MODEL_LEN, LoadContext, ProgramModel, ServingDefaults
from engine.llm.sampler import Sampler
from engine.llm.scheduler import LIGHT_SLACK_S, Scheduler

__all__ = ["auto_decode_cap", "auto_decode_cap_budget", "build_lm_backend", "model_setting_value"]

log = logging.getLogger(__name__)

ProgramLoader = Callable[[LoadContext], ProgramModel]


def _prefill_buckets(asked: Sequence[int], max_model_len: int, default: Sequence[int] = ()) -> list[int] | None:
    """The prefill graphs' token counts from the setting, for ``()`` the program's ``default``:
    None (the runner's default) when both are ``()``; those up to ``max_model_len``, refused
    when none is."""
    asked = asked or default
    if not asked:
        return None
    kept = [t for t in asked if t <= max_model_len]
    if not kept:
        raise ValueError(f"prefill_token_buckets {','.join(map(str, asked))}: none is within "
                         f"max_model_len={max_model_len}")
    return kept


def _resolve_async(value: bool | str, runner: Any) -> bool:
    """``async_steps`` from True/False or "on"/"off"/"auto" (on when the runner replays graphs)."""
    if isinstance(value, bool):
        return value
    if value not in ("auto", "on", "off"):
        raise ValueError(f"async_steps must be auto, on or off, got {value!r}")
    return value == "on" or (value == "auto" and bool(getattr(runner, "use_graphs", False)))


def _triton_imports() -> bool:
    """Whether Triton imports here (it comes with CUDA torch; the runtime's Triton kernels need it)."""
    from engine.llm import kv_write_triton

    return kv_write_triton.triton is not None


def _sampler_kernel(kernel: str) -> str:
    """``Sampler.kernel``'s value, checked: "triton" needs Triton (it comes with CUDA torch);
    "auto" is torch until the program's default is known (``_auto_sampler_kernel``)."""
    if kernel == "auto":
        return "torch"
    if kernel not in ("torch", "triton"):
        raise ValueError(f"sampler_kernel must be auto, torch or triton, got {kernel!r}")
    if kernel == "triton":
        from engine.llm import sample_triton

        if sample_triton.triton is None:
            raise ValueError("--sampler-kernel triton needs Triton (it comes with CUDA torch)")
    return kernel


def _auto_sampler_kernel(defaults: ServingDefaults, device: str) -> str:
    """``--sampler-kernel auto`` once the program is loaded: its default on CUDA where Triton
    imports, torch elsewhere."""
    from engine.llm import sample_triton

    if not device.startswith("cuda") or defaults.sampler_kernel == "torch" or sample_triton.triton is None:
        return "torch"
    return _sampler_kernel(defaults.sampler_kernel)


def _light_steps(asked: int, head: Any, defaults: ServingDefaults, device: str, slack_s: float = LIGHT_SLACK_S) -> dict[str, Any]:
    """The scheduler's light-step settings: ``asked`` (-1 = the program's default on CUDA, off
    on the CPU), for a head that names its light steps (``light_until_step``) and captures its
    cheaper variants up to some rows (``variants``), while no playing row is due within
    ``slack_s``; none for another head."""
    until = int(getattr(head, "light_until_step", 0) or 0)
    variants = tuple(getattr(head, "variants", ()) or ())
    n = asked if asked >= 0 else (defaults.light_steps if device == "cuda" else 0)
    if n <= 0 or until <= 0:
        return {}
    return {"light_steps_max": n, "light_until_step": until, "light_max_rows": min(variants) if variants else 16,
            "light_slack_s": slack_s}


def _prefill_batching(wait_s: float, batch_seqs: int, runner: Any,
                      defaults: ServingDefaults = ServingDefaults()) -> tuple[float, int]:
    """``prefill_wait_s`` and ``prefill_batch_seqs``, -1 resolved: with prefill graphs the
    program's defaults (a prompt's own replay is a pass over all the weights, so prompts wait
    to share it); with mixed graphs as well, 0 (prompts ride in the decode rows' pass and cost
    only their own tokens: waiting would only delay them); otherwise 0."""
    graphs = getattr(runner, "prefill_graphs", None) is not None
    separate = graphs and getattr(runner, "mixed_graphs", None) is None
    if wait_s < 0:
        wait_s = defaults.prefill_wait_s if separate else 0.0
    if batch_seqs < 0:
        batch_seqs = defaults.prefill_batch_seqs if separate else 0
    return wait_s, batch_seqs


def model_setting_value(name: str, value: str, default: Any) -> Any:
    """A ``--model-setting`` value (text) as the type of the setting's default: an int, float or
    bool (true/false, on/off, 1/0, yes/no), else the text; for a default of None (a setting
    that is off unless given) a number where the text is one. ValueError naming the setting."""
    if isinstance(default, bool):
        v = value.strip().lower()
        if v in ("1", "true", "on", "yes"):
            return True
        if v in ("0", "false", "off", "no"):
            return False
        raise ValueError(f"--model-setting {name}={value}: expects true or false")
    for kind, what in ((int, "an integer"), (float, "a number")):
        if isinstance(default, kind):
            try:
                return kind(value)
            except ValueError:
                raise ValueError(f"--model-setting {name}={value}: expects {what}") from None
    if default is None:
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
    return value


def auto_decode_cap(cap: int, device: str, fp8_weights: bool, defaults: ServingDefaults = ServingDefaults()) -> int:
    """``cap`` as given, or for -1 (auto) the program's measured cap on CUDA (its fp8 one with
    fp8 weights), no cap (0) on the CPU."""
    if cap >= 0:
        return cap
    if device != "cuda":
        return 0
    return defaults.decode_cap_fp8 if fp8_weights else defaults.decode_cap


def auto_decode_cap_budget(device: str, fp8_weights: bool, defaults: ServingDefaults = ServingDefaults()) -> float:
    """The program's fraction for the measured decode cap (``AdmissionConfig.decode_cap_budget``
    -1) on CUDA (its fp8 one with fp8 weights); 0 (off) on the CPU, where the cap is off too."""
    if device != "cuda":
        return 0.0
    return defaults.decode_cap_budget_fp8 if fp8_weights else defaults.decode_cap_budget


def _same_device(a: str, b: str) -> bool:
    """"cuda" is the current GPU, "cuda:0" under one visible device: the same place."""
    def norm(d: str) -> str:
        return "cuda:0" if d == "cuda" else d
    return norm(a) == norm(b)


def check_codec_device(asked: str | None, lm_device: str, placed: str | None, model: str) -> None:
    """Refuse a ``codec_device`` the program did not honour (ValueError), unless it is the LM's
    own device (then there is nothing to move)."""
    if asked is None or _same_device(asked, lm_device):
        return
    if placed is None or not _same_device(placed, asked):
        raise ValueError(f"--codec-device {asked}: model {model} runs its codec on the LM's device "
                         f"({lm_device}) only; models that can move it: orpheus")


def check_flashinfer_head_dim(model: str, head_dim: int, uses_flashinfer: bool) -> None:
    """Refuse, naming the way out, a model whose head size FlashInfer's kernels are not built
    for, right after its load (FlashInfer's own error came from inside the first capture)."""
    from engine.llm.flashinfer_attention import HEAD_DIMS

    if uses_flashinfer and head_dim not in HEAD_DIMS:
        raise ValueError(f"{model}: head_dim {head_dim}, and FlashInfer's attention (CUDA) takes "
                         f"{', '.join(map(str, HEAD_DIMS))}: serve it with --device cpu (the tiny test "
                         "models' 16 is one)")


def build_lm_backend(
    load: ProgramLoader,
    model_path_or_id: str,
    *,
    config: Any = None,
    device: str | None = None,
    load_format: str | None = None,
    dtype: str | None = None,
    gpu_memory_utilization: float | None = None,
    max_num_seqs: int | None = None,
    max_model_len: int | None = None,
    page_size: int = 16,
    max_num_batched_tokens: int | None = None,
    max_waiting: int = 1024,
    num_pages: int | None = None,
    cpu_kv_cache_bytes: int = 2 << 30,
    reserve_bytes: int = 2 << 30,
    max_num_decode_seqs: int | None = None,
    decode_horizon_s: float | None = None,
    decode_fill_seqs: int | None = None,
    prefill_wait_s: float | None = None,
    prefill_batch_seqs: int | None = None,
    light_steps: int | None = None,
    light_slack_s: float | None = None,
    sampler_kernel: str | None = None,
    hold_undue_prompts: bool | str | None = None,
    async_steps: bool | str | None = None,
    mixed_graphs: bool | str | None = None,
    async_plan: bool | str | None = None,
    decode_attention: str | None = None,
    prefill_token_buckets: Sequence[int] | None = None,
    kv_write: str | None = None,
    attention_backend_factory: Any = None,
    runner_factory: Any = None,
    warmup: bool = True,
    kv_cache_dtype: str | None = None,
    quantization: str | None = None,
    **program_settings: Any,
) -> LMBackend:
    """Load the program ``load`` serves and assemble an ``LMBackend``.

    Settings come from ``config`` (an ``engine.config.EngineConfig``) unless given as keywords;
    ``program_settings`` are the program's own (``LoadContext.setting``: a keyword here, then
    the config's field of that name, then the program's default).
    ``kv_cache_dtype`` "fp8" / ``quantization`` "fp8": the fp8 options (``engine.llm.fp8``).
    ``device`` "auto" picks CUDA when available; ``dtype`` "auto" is bf16 on CUDA, fp32 on CPU.
    KV cache: ``num_pages`` if given; on CUDA, what fits in ``total * gpu_memory_utilization``
    after the weights, minus ``reserve_bytes`` for activations and graphs (the config's
    ``gpu_memory_share``: engines sharing the GPU, each with its part:
    ``model_runner.kv_budget_bytes``); on the CPU,
    ``cpu_kv_cache_bytes``. Never more than ``max_num_seqs`` full-length sequences need, never
    less than one. One page (``runner.scratch_page``) is owned by no sequence: CUDA-graph
    padding rows write there. On CUDA with flashinfer installed the runner is
    ``CudaGraphModelRunner`` (``enable_cuda_graphs``, default) or ``ModelRunner`` with
    FlashInfer attention; ``runner_factory`` / ``attention_backend_factory`` override.
    ``max_num_batched_tokens`` defaults to ``max(512, max_num_seqs + 256)`` (every decode plus
    at least 256 prompt tokens). With prefill graphs the scheduler packs whole fresh prompts
    only, up to the graphs' row limit per step.
    ``max_num_decode_seqs``: decode rows per step, earliest deadlines first (``SchedulerConfig``);
    -1 (default) = the program's ``ServingDefaults`` cap on CUDA, no cap on the CPU.
    ``decode_horizon_s`` / ``decode_fill_seqs``: decode only jobs due within the horizon,
    filling up to that many rows (``SchedulerConfig``); -1 (default) = the program's defaults on
    CUDA, off on the CPU. ``prefill_wait_s`` / ``prefill_batch_seqs``: under load, fresh prompts
    wait that long (once due) for that many to share one prefill pass; -1 (default) = the
    program's defaults with prefill graphs, off otherwise and with mixed graphs
    (``_prefill_batching``). ``light_steps``: a new sequence's cheap first steps (the head's
    ``light_until_step``) take up to that many steps in a row of their own (``_light_steps``; -1 =
    the program's default on CUDA, 0 = off), while no playing row is due within
    ``light_slack_s`` (default ``LIGHT_SLACK_S``, 0.05 s). ``sampler_kernel``: "auto" (default: the program's
    ``ServingDefaults.sampler_kernel`` on CUDA where Triton imports, torch elsewhere), "torch" or
    "triton" (``Sampler.kernel``, set for the process). ``hold_undue_prompts`` (True / "on"; default off): under load,
    prompts not due within the horizon wait. ``async_steps``: launch each step before the
    previous one's tokens reach the host (``LMBackend``): True / "on", False / "off", or "auto"
    (default): on when the runner replays CUDA graphs. ``mixed_graphs``: "on" / True captures
    ``MixedGraphs`` (decode rows and fresh prompts in one replay) where the program supports it;
    "off" (default). ``async_plan``: "on" / True (default): the graphs' attention plans do not
    wait for the step in flight. ``decode_attention``: the decode kernel in the graphs,
    FlashInfer's "cuda-cores" or "tensor-cores", or "triton" (the runtime's own,
    ``engine.llm.decode_attention_triton``). ``kv_write``: how keys and values are stored into
    the cache, "index" or "triton" (CUDA; ``attention.set_kv_write``, for the process). For either,
    "auto" (default) is the program's ``ServingDefaults`` choice on CUDA where Triton imports,
    "cuda-cores" / "index" elsewhere (``engine.llm.kernels.resolve_kernel``).
    ``prefill_token_buckets``: the prefill graphs' token counts (``()``, default: the program's
    ``ServingDefaults.prefill_token_buckets``, else the runner's ``DEFAULT_PREFILL_BUCKETS``).
    The backend's ``default_decode_cap_budget`` is the program's measured-cap fraction
    (``auto_decode_cap_budget``), which the engine core takes for ``decode_cap_budget`` -1.
    """
    import torch

    from engine.llm.attention import set_kv_write
    from engine.llm.fp8 import resolve_fp8_options
    from engine.llm.model_runner import kv_bytes_per_page, num_pages_for_memory
    from engine.llm.page_allocator import PageAllocator
    from engine.llm.scheduler import SchedulerConfig

    def pick(value: Any, name: str, default: Any) -> Any:
        if value is not None:
            return value
        return getattr(config, name, default) if config is not None else default

    device = pick(device, "device", "auto")
    # (before the model's heads make their samplers; one engine a process)
    kernel_asked = pick(sampler_kernel, "sampler_kernel", "auto")
    Sampler.kernel = _sampler_kernel(kernel_asked)
    load_format = pick(load_format, "load_format", "auto")
    dtype_name = pick(dtype, "dtype", "auto")
    utilization = pick(gpu_memory_utilization, "gpu_memory_utilization", 0.85)
    max_num_seqs = pick(max_num_seqs, "max_num_seqs", 256)
    max_model_len = pick(max_model_len, "max_model_len", -1)
    len_auto = max_model_len == -1
    if len_auto:
        max_model_len = DEFAULT_MAX_MODEL_LEN
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch sees no CUDA GPU")
    on_cuda = str(device).startswith("cuda")
    asked_write = check_kernel("kv_write", pick(kv_write, "kv_write", "auto"))
    if asked_write == "triton" and not on_cuda:
        raise ValueError(f"--kv-write triton needs CUDA (device {device!r})")
    # (one engine a process, as the sampler's kernel; "auto" waits for the program's default)
    set_kv_write("index" if asked_write == "auto" else asked_write)
    asked_attention = check_kernel("decode_attention", pick(decode_attention, "decode_attention", "auto"))
    if asked_attention == "triton" and on_cuda and not _triton_imports():
        raise ValueError("--decode-attention triton needs Triton (it comes with CUDA torch)")
    if dtype_name == "auto":
        dtype_name = "bfloat16" if device == "cuda" else "float32"
    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype_name]
    # fp8 options (engine.llm.fp8): CUDA + bf16 only, refused here at start-up otherwise.
    kv_dtype, quantise_fp8 = resolve_fp8_options(
        pick(kv_cache_dtype, "kv_cache_dtype", "auto"), pick(quantization, "quantization", "none"),
        device=device, dtype=torch_dtype,
    )
    has_flashinfer = importlib.util.find_spec("flashinfer") is not None
    enable_graphs = pick(None, "enable_cuda_graphs", True)
    use_graphs = device == "cuda" and enable_graphs and has_flashinfer

    overrides = dict(getattr(config, "model_settings", None) or ())
    asked: set[str] = set()

    def setting(name: str, default: Any) -> Any:
        asked.add(name)
        if program_settings.get(name) is None and name in overrides:
            return model_setting_value(name, overrides[name], default)
        return pick(program_settings.get(name), name, default)

    import time

    t0 = time.monotonic()
    weights = "random weights" if load_format == "dummy" else "weights from the checkpoint"
    log.info("loading %s (%s) on %s in %s ...", model_path_or_id, weights, device, dtype_name)
    loaded = load(LoadContext(
        model_id=str(model_path_or_id), device=device, dtype=torch_dtype, load_format=load_format,
        max_num_seqs=max_num_seqs, max_model_len=max_model_len, quantise_fp8=quantise_fp8,
        use_graphs=use_graphs, setting=setting, max_model_len_auto=len_auto,
    ))
    check_codec_device(setting("codec_device", None), device, loaded.codec_device, str(model_path_or_id))
    unknown = sorted(set(overrides) - asked)
    if unknown:
        known = ", ".join(sorted(asked - {"codec_device"})) or "none"
        raise ValueError(f"--model-setting {', '.join(unknown)}: not a setting of {model_path_or_id} "
                         f"(its settings: {known})")
    program, shape, defaults = loaded.program, loaded.kv_shape, loaded.defaults
    check_flashinfer_head_dim(str(model_path_or_id), shape.head_dim, device == "cuda" and has_flashinfer
                              and runner_factory is None and (enable_graphs or attention_backend_factory is None))
    if loaded.max_model_len is not None and loaded.max_model_len != max_model_len:
        if not 2 <= loaded.max_model_len < max_model_len:
            raise ValueError(f"{model_path_or_id}: its load returned max_model_len={loaded.max_model_len}, "
                             f"not in [2, {max_model_len})")
        log.info("max_model_len %d: the model's positions (--max-model-len auto)", loaded.max_model_len)
        max_model_len = loaded.max_model_len
    if kernel_asked == "auto":  # (before any graph captures a draw)
        Sampler.kernel = _auto_sampler_kernel(defaults, device)
    # "auto": the program's kernels on CUDA where Triton imports (before the runner writes a key),
    # on the device the other automatic settings count as CUDA (auto_decode_cap)
    auto_cuda = device == "cuda" and _triton_imports()
    attention_kernel = resolve_kernel("decode_attention", asked_attention, defaults.decode_attention,
                                      cuda=device == "cuda", triton_imports=auto_cuda)
    write_kind = resolve_kernel("kv_write", asked_write, defaults.kv_write, cuda=device == "cuda",
                                triton_imports=auto_cuda)
    set_kv_write(write_kind)
    log.info("loaded in %.1f s; building the KV cache%s", time.monotonic() - t0,
             " and capturing CUDA graphs" if use_graphs and runner_factory is None else "")
    if on_cuda:
        log.info("decode attention %s, KV write %s%s", attention_kernel, write_kind,
                 " (the model's)" if "auto" in (asked_attention, asked_write) else "")

    pages_per_seq = -(-max_model_len // page_size)
    if num_pages is None:
        if device == "cuda":
            num_pages = num_pages_for_memory(
                shape, page_size=page_size, dtype=kv_dtype, device=torch.device(device),
                gpu_memory_utilization=utilization, reserve_bytes=reserve_bytes,
                gpu_memory_share=pick(None, "gpu_memory_share", 1),
            )
        else:
            num_pages = cpu_kv_cache_bytes // kv_bytes_per_page(shape, page_size, kv_dtype)
        num_pages = min(num_pages, max_num_seqs * pages_per_seq + 1)
    if num_pages - 1 < pages_per_seq:  # (one page may become the scratch page)
        raise ValueError(
            f"the KV cache ({num_pages} pages of {page_size}) cannot hold one sequence of "
            f"max_model_len={max_model_len}; lower max_model_len or give it more memory"
        )
    decode_cap = auto_decode_cap(pick(max_num_decode_seqs, "max_num_decode_seqs", -1), device, quantise_fp8, defaults)
    if runner_factory is None and device == "cuda":
        from engine.llm.cuda_graphs import CudaGraphModelRunner, decode_buckets_up_to, flashinfer_attention_factory

        if not has_flashinfer:
            log.warning("flashinfer is not installed: plain torch paged attention, no CUDA graphs")
        elif enable_graphs:
            from engine.llm.mixed_graphs import mixed_decode_buckets

            mixed = pick(mixed_graphs, "mixed_graphs", "off") in (True, "on")
            if mixed and not loaded.supports_mixed_graphs:
                log.warning("this program does not support mixed graphs: --mixed-graphs ignored")
                mixed = False
            runner_factory = functools.partial(CudaGraphModelRunner, max_model_len=max_model_len,
                                               decode_buckets=decode_buckets_up_to(decode_cap or max_num_seqs),
                                               graph_forward=loaded.graph_forward, mixed=mixed,
                                               mixed_decode_buckets=mixed_decode_buckets(decode_cap),
                                               async_plan=pick(async_plan, "async_plan", "on") in (True, "on"),
                                               decode_attention=attention_kernel,
                                               prefill_buckets=_prefill_buckets(
                                                   pick(prefill_token_buckets, "prefill_token_buckets", ()),
                                                   max_model_len, defaults.prefill_token_buckets))
        else:
            attention_backend_factory = attention_backend_factory or flashinfer_attention_factory
    runner_kw: dict[str, Any] = {}
    if attention_backend_factory is not None:
        runner_kw["attention_backend_factory"] = attention_backend_factory
    if kv_dtype != torch_dtype:
        runner_kw["kv_cache_dtype"] = kv_dtype
    if loaded.head is not None:
        runner_kw["head"] = loaded.head
    else:
        runner_kw.update(vocab_ids=getattr(program, "vocab_ids", None), allowed_table=getattr(program, "allowed_table", None))
    runner = (runner_factory or ModelRunner)(
        loaded.model, shape, device=device, dtype=torch_dtype, num_pages=num_pages, page_size=page_size,
        max_num_seqs=max_num_seqs, uses_token_rows=loaded.uses_token_rows, **runner_kw,
    )
    allocator_pages = num_pages
    if runner.scratch_page is None:  # keep the last page out of the allocator's range
        allocator_pages = num_pages - 1
        runner.scratch_page = allocator_pages
    prefill_graphs = getattr(runner, "prefill_graphs", None)
    horizon = pick(decode_horizon_s, "decode_horizon_s", -1.0)
    if horizon < 0:
        horizon = defaults.decode_horizon_s if device == "cuda" else 0.0
    fill = pick(decode_fill_seqs, "decode_fill_seqs", -1)
    if fill < 0:
        fill = defaults.decode_fill_seqs if device == "cuda" else 0
    light = _light_steps(pick(light_steps, "light_steps", -1), loaded.head, defaults, device,
                         pick(light_slack_s, "light_slack_s", LIGHT_SLACK_S))
    prefill_wait, prefill_batch = _prefill_batching(pick(prefill_wait_s, "prefill_wait_s", -1.0),
                                                    pick(prefill_batch_seqs, "prefill_batch_seqs", -1), runner, defaults)
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
            **light,
            whole_prompts=prefill_graphs is not None,
        ),
        PageAllocator(allocator_pages, page_size),
    )
    backend = LMBackend(program, runner, scheduler,
                        async_steps=_resolve_async(pick(async_steps, "async_steps", "auto"), runner),
                        default_decode_cap_budget=auto_decode_cap_budget(device, quantise_fp8, defaults))
    if load_format == "dummy":
        backend.info = dataclasses.replace(backend.info, weights="random")
    if warmup:
        t1 = time.monotonic()
        log.info("warming up (one short job end to end) ...")
        backend.warmup()
        log.info("warm in %.1f s (%.1f s since loading began)", time.monotonic() - t1, time.monotonic() - t0)
    return backend
