"""Loading the Orpheus program for the runtime: Llama-3B + SNAC, its codec graphs, its defaults.

``load`` is what ``engine.llm.build.build_lm_backend`` calls (``--model orpheus``);
``build_orpheus_backend`` is the same with Orpheus's own settings as keywords.
"""

from __future__ import annotations

from typing import Any

from engine.llm.backend import LMBackend
from engine.llm.program import LoadContext, ProgramModel, ServingDefaults, codec_dtype

__all__ = ["ORPHEUS_DEFAULTS", "build_orpheus_backend", "load"]

RAMP_WINDOW_FRAMES = 4  # window decoder frames when it only serves the fast-start ramp
# Decode rows per step by default on CUDA (scheduler.max_num_decode_seqs), bf16 weights: a
# ceiling of 512 under the cap measured from step times (AUTO_DECODE_CAP_BUDGET_CUDA). 384 as a
# constant (11.1-11.8 ms steps served on an H200, runs 24-26) until session 48: with the budget,
# 512, the prefill settings below and the Triton kernels, 480 and 512 streams over 10 s passed on
# an H200 where the old defaults refused 163 and 403 starts (docs/performance.md, e1d8535b)
AUTO_DECODE_CAP_CUDA = 512
AUTO_DECODE_CAP_BUDGET_CUDA = 0.85  # admission decode_cap_budget (bf16): rows whose step takes <= 85% of real time
# With fp8 weights (--quantization fp8), on H200s (docs/performance_history.md run 28): at cap 512, steps
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
# scheduler.prefill_wait_s / prefill_batch_seqs: a due prompt waits at most 100 ms for company,
# 16 prompts go at once, in prefill graphs of these token counts (finer than the runner's
# 32, 64, 128, 256, 512: three ~55-token prompts pad to 192, not 256). Together with the cap
# above: more streams admitted for the same step time on two H100s (bfa42ffc, 5df2e740) and an
# H200 (e1d8535b); 50 ms, 8 and the runner's counts before (docs/performance.md)
AUTO_PREFILL_WAIT_S_CUDA = 0.1
AUTO_PREFILL_BATCH_CUDA = 16
AUTO_PREFILL_TOKEN_BUCKETS = (32, 64, 96, 128, 192, 256, 384, 512)
# The runtime's Triton decode attention and KV write (with orpheus_norm and orpheus_silu_mul
# "triton" under CUDA graphs, load below): engine steps 5% shorter at 448 rows on an H100, and
# on an H200 512 streams over 10 s 99.5% on time against 95.8% without them (docs/performance.md)
ORPHEUS_DEFAULTS = ServingDefaults(
    decode_cap=AUTO_DECODE_CAP_CUDA, decode_cap_fp8=AUTO_DECODE_CAP_CUDA_FP8,
    decode_cap_budget=AUTO_DECODE_CAP_BUDGET_CUDA,
    decode_horizon_s=AUTO_DECODE_HORIZON_S_CUDA, decode_fill_seqs=AUTO_DECODE_FILL_CUDA,
    prefill_wait_s=AUTO_PREFILL_WAIT_S_CUDA, prefill_batch_seqs=AUTO_PREFILL_BATCH_CUDA,
    prefill_token_buckets=AUTO_PREFILL_TOKEN_BUCKETS, decode_attention="triton", kv_write="triton",
)


def _ramp_steps(ramp_step_samples: int, device: str) -> dict[str, int | None]:
    """OrpheusProgram's ramp settings: a fixed step, or (0) the automatic pair on CUDA."""
    if ramp_step_samples:
        return {"ramp_step_samples": ramp_step_samples, "loaded_ramp_step_samples": None}
    light, loaded = AUTO_RAMP_STEPS_CUDA
    return {"ramp_step_samples": light, "loaded_ramp_step_samples": loaded if device == "cuda" else None}


def load(ctx: LoadContext) -> ProgramModel:
    """Orpheus + SNAC on ``ctx.device``. Settings (``ctx.setting``): ``codec_path`` (local SNAC
    dir or hub id), ``stateful_codec`` (default True: SNAC decodes each frame once per stream,
    ``StreamingCodecGraphs``, CUDA graphs when graphs serve; False re-decodes a window per
    frame), ``codec_dtype`` of the stateful codec ("auto": bf16 on CUDA, fp32 on the CPU;
    "float32", "bfloat16"; the ramp's window decodes stay fp32), ``codec_compile`` (default:
    with CUDA graphs; the stateful codec's channels-last step through ``torch.compile``),
    ``ramp_step_samples`` (the fast-start ramp's lookahead growth per frame,
    ``models.orpheus.codec.StreamingDecoder``; 0 = ``AUTO_RAMP_STEPS_CUDA`` on CUDA, the second
    for segments that start under load, 1024 on the CPU), ``codec_device`` (SNAC, its window
    graphs and its stateful codec on another device than the LM, e.g. "cuda:1"; the codec
    takes its frames from the host, so nothing else moves), ``orpheus_rope`` (the graphed
    forward's rotary embedding: "triton", the default with CUDA graphs: one kernel a layer,
    ``models.orpheus.layer_triton``; or "compiled": ``torch.compile``'s three), ``orpheus_silu_mul``
    (its SiLU-mul: "triton", the default with CUDA graphs, or "compiled"), ``orpheus_norm`` (its
    residual adds and RMSNorms, with fp8 weights the activations' quantisation fused in:
    "triton", the default with CUDA graphs, or "compiled"; both served with the runtime's Triton
    decode attention and KV write, ``ORPHEUS_DEFAULTS``)."""
    from engine.llm.fp8 import quantise_decoder_linears_
    from models.orpheus.fused_forward import FusedLlamaForward
    from models.orpheus.loader import SNAC_HUB_ID, load_orpheus
    from models.orpheus.program import OrpheusProgram

    device = ctx.device
    rope = ctx.setting("orpheus_rope", "triton" if ctx.use_graphs else "compiled")
    silu_mul = ctx.setting("orpheus_silu_mul", "triton" if ctx.use_graphs else "compiled")
    norm = ctx.setting("orpheus_norm", "triton" if ctx.use_graphs else "compiled")
    FusedLlamaForward.check(rope, silu_mul, norm)  # (before the weights load)
    model, tokenizer, llama_config = load_orpheus(
        ctx.model_id, device=device, dtype=ctx.dtype, load_format=ctx.load_format, max_seq_len=ctx.max_model_len
    )
    if ctx.quantise_fp8:
        quantise_decoder_linears_(model)  # before the fused forward is built
    codec_path = ctx.setting("codec_path", None) or SNAC_HUB_ID
    codec_device = codec_device_for(ctx.setting("codec_device", None), device)
    with _on(codec_device):
        codec, decode_fn, stream_codec, window_frames = _load_codec(ctx, codec_path, codec_device)
    program = OrpheusProgram(tokenizer, codec, model_name=ctx.model_id, decode_fn=decode_fn,
                             stream_codec=stream_codec, window_frames=window_frames,
                             **_ramp_steps(ctx.setting("ramp_step_samples", 0), device))
    graph_forward = FusedLlamaForward.for_model(model, rope=rope, silu_mul=silu_mul,
                                                 norm=norm) if ctx.use_graphs else None
    return ProgramModel(program=program, model=model, kv_shape=llama_config, graph_forward=graph_forward,
                        defaults=ORPHEUS_DEFAULTS, codec_device=codec_device)


def codec_device_for(asked: str | None, device: str) -> str:
    """The codec's device: ``asked`` (checked: a GPU torch sees), else the LM's."""
    import torch

    if asked is None:
        return device
    dev = torch.device(asked)
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"--codec-device {asked}: torch sees {torch.cuda.device_count()} CUDA GPU(s)")
    return asked


def _on(device: str) -> Any:
    """The codec's device as the current one while its graphs are captured (a no-op on the CPU)."""
    import contextlib

    import torch

    return torch.cuda.device(torch.device(device)) if device.startswith("cuda") else contextlib.nullcontext()


def _load_codec(ctx: LoadContext, codec_path: str, device: str) -> tuple[Any, Any, Any, int | None]:
    """SNAC on ``device``: (decoder, window decode function or None, stateful codec or None,
    window frames)."""
    from models.orpheus.codec import SnacDecoder
    from models.orpheus.loader import load_snac

    codec = SnacDecoder(load_snac(codec_path, device=device, load_format=ctx.load_format)).to(device)
    graphs = ctx.use_graphs and device.startswith("cuda")
    decode_fn = None
    use_stateful = ctx.setting("stateful_codec", True)
    # With the stateful codec the window decoder only serves the fast-start ramp (frames 1-4,
    # all of them from the stream's start), so 4-frame windows suffice: a third less work.
    window_frames = RAMP_WINDOW_FRAMES if use_stateful else None
    if graphs:
        from models.orpheus.codec_graphs import make_graph_decode_fn

        decode_fn = make_graph_decode_fn(codec, window_frames=window_frames)  # all streams' windows, one replay
    stream_codec = None
    if use_stateful:  # each frame through SNAC once (models.orpheus.program)
        from models.orpheus.codec_stream_graphs import StreamingCodecGraphs
        from models.orpheus.snac_stream import StreamingSnac

        # torch.compile'd channels-last step on CUDA graphs: 1.14 ms for 64 rows in bf16 on the
        # H200 vs 4.22 ms for the plain NCW layers (benchmark.gpu.codec_stream --compare); ~40 s of
        # compilation at start-up.
        compiled = ctx.setting("codec_compile", decode_fn is not None)
        stream_codec = StreamingCodecGraphs(
            StreamingSnac(codec, max_streams=ctx.max_num_seqs, device=device, dtype=codec_dtype(ctx, device),
                          channels_last=compiled, compile=compiled),
            capture=decode_fn is not None)
    return codec, decode_fn, stream_codec, window_frames


def build_orpheus_backend(model_path_or_id: str, **kwargs: Any) -> LMBackend:
    """``build_lm_backend`` for Orpheus: the runtime's keywords and ``load``'s settings
    (``codec_path``, ``stateful_codec``, ``codec_dtype``, ``codec_compile``, ``ramp_step_samples``)."""
    from engine.llm.build import build_lm_backend

    return build_lm_backend(load, model_path_or_id, **kwargs)
