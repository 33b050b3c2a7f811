"""Loading the Qwen3-TTS program for the runtime (``--model qwen3-tts``, ``Qwen/Qwen3-TTS-...``)."""

from __future__ import annotations

from typing import Any

from engine.llm.backend import LMBackend
from engine.llm.program import KVShape, LoadContext, ProgramModel, ServingDefaults, codec_dtype as program_codec_dtype

__all__ = ["CODEC_DEFAULTS_CUDA", "QWEN3_DEFAULTS", "build_qwen3_backend", "code_predictor_attention", "codec_attention",
           "codec_settings", "load"]

# No decode cap: every running stream decodes each step (640 streams on time on two H200s with
# the fill of 256; a fill of 512 did worse at 704: docs/performance.md). The runtime sampler's
# draw in one Triton kernel on CUDA (``--sampler-kernel auto``), with the code predictor's Triton
# attention (below): the frame head 22.3 against 33.6 ms at 1,024 rows (743e4974); 896 streams
# served on time on two H200s against 768 (743e4974, 38302929).
QWEN3_DEFAULTS = ServingDefaults(decode_cap=0, decode_cap_fp8=0, sampler_kernel="triton")
# The codec step on CUDA: channels-last, SnakeBeta compiled (29.8 ms at 512 rows against 43.9 for
# the reference's layout and 35.5 uncompiled, 9c8f0f3f), its dense convolutions the Triton
# implicit GEMM where Triton is installed (21.5 ms at 512 rows against 29.6 for gathered taps,
# 7d77926e; 768 streams served on time on two H200s against 640, docs/performance.md), since
# session 40 in its ``fused`` form (the residual sum and the next SnakeBeta in the kernel's
# epilogue: 42.9 against 45.0 ms at 1,024 rows, 29.6 against 31.6 with the ring attention below,
# a8fb659b). On the CPU the reference's layout (inductor's C++ build is not required).
CODEC_DEFAULTS_CUDA = ("nwc", True, "fused")


def load(ctx: LoadContext) -> ProgramModel:
    """Talker + code predictor on ``ctx.device`` in ``ctx.dtype``; the codec in ``codec_dtype``
    ("auto": bfloat16 on CUDA, float32 on the CPU; "float32", "bfloat16"); the speaker encoder on
    Base checkpoints. Setting (``ctx.setting``): ``codec_layout`` ("nwc": the codec step on
    channels-last activations, models/qwen3_tts/codec_nwc.py; "ncw": the reference's modules;
    the same audio), ``codec_compile`` (that step's SnakeBeta fused by ``torch.compile``) and
    ``codec_conv`` ("gemm", "cudnn", "triton", "fused" or "fused-state": its dense convolutions' kind). Defaults: ``nwc``
    compiled with the Triton convolution in its fused form on CUDA (``CODEC_DEFAULTS_CUDA``;
    "gemm" where Triton is missing), ``ncw`` on the CPU."""
    from engine.llm.fp8 import quantise_decoder_linears_
    from models.qwen3_tts.codec_nwc import make_codec_stream
    from models.qwen3_tts.loader import load_qwen3_tts
    from models.qwen3_tts.program import Qwen3Forward, Qwen3Head, Qwen3Program, Qwen3Slots, StandInTokenizer

    codec_dtype = program_codec_dtype(ctx)
    layout, compile_codec, compile_fallback, conv = codec_settings(ctx)
    model_id = ctx.model_id
    loaded = load_qwen3_tts(model_id, device=ctx.device, dtype=ctx.dtype, codec_dtype=codec_dtype,
                            load_format=ctx.load_format)
    config = loaded.config
    talker = loaded.model.talker
    if ctx.quantise_fp8:
        quantise_decoder_linears_(talker.model)
    tokenizer = loaded.tokenizer or StandInTokenizer(config)
    talker.code_predictor.attend = code_predictor_attention(ctx)
    slots = Qwen3Slots(talker, ctx.max_num_seqs, ctx.device)
    codec_stream = make_codec_stream(loaded.codec, ctx.max_num_seqs, layout=layout, compile=compile_codec,
                                     compile_fallback=compile_fallback, conv=conv, device=ctx.device,
                                     dtype=codec_dtype)
    codec_stream.attend = codec_attention(ctx)
    program = Qwen3Program(talker, config, tokenizer, codec_stream, model_name=model_id, slots=slots,
                           speaker_encoder=loaded.model.speaker_encoder)
    if ctx.use_graphs:
        program.codec.capture(ctx.max_num_seqs, desc="qwen3 codec graphs")
    t = config.talker
    shape = KVShape(t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads, t.head_dim, t.vocab_size)
    return ProgramModel(program=program, model=Qwen3Forward(talker, slots), kv_shape=shape,
                        head=Qwen3Head(talker, slots), uses_token_rows=True, supports_mixed_graphs=False,
                        defaults=QWEN3_DEFAULTS)


def codec_settings(ctx: LoadContext) -> tuple[str, bool, bool, str | None]:
    """The codec step's (layout, compiled, fallback, convolution kind) from the settings, the
    device's defaults for what is not set (a compiled SnakeBeta only with the channels-last
    layout). ``fallback``: the compile is the default, not asked for, so a machine where it
    cannot compile serves unfused rather than failing (``compiled_snake``)."""
    from engine.llm.build import model_setting_value

    cuda = ctx.device.startswith("cuda")
    layout_default, compile_default, conv_default = CODEC_DEFAULTS_CUDA if cuda else ("ncw", False, None)
    layout = str(ctx.setting("codec_layout", layout_default))
    asked = ctx.setting("codec_compile", None)  # None: not given
    if isinstance(asked, str):
        asked = model_setting_value("codec_compile", asked, False)
    compile_codec = bool(asked) if asked is not None else (compile_default and layout == "nwc")
    conv = ctx.setting("codec_conv", None)  # (None: the device's default, or the layout's own)
    if conv is None and layout == "nwc" and conv_default is not None:
        conv = conv_default if triton_available() else None
    return layout, compile_codec, asked is None, None if conv is None else str(conv)


def code_predictor_attention(ctx: LoadContext) -> Any:
    """``code_predictor_attention``: "triton" (one kernel a position, ``attend_triton.attend_position``;
    the default on CUDA where Triton imports; elsewhere only under Triton's CPU interpreter) or
    "sdpa" (the default elsewhere: the cache writes and torch's attention) -> the code
    predictor's ``attend`` (None for "sdpa")."""
    from models.qwen3_tts import attend_triton
    from models.triton_setting import triton_asked

    default = "triton" if ctx.device.startswith("cuda") and attend_triton.triton is not None else "sdpa"
    return attend_triton.attend_position if triton_asked(ctx, "code_predictor_attention", default, "sdpa",
                                                          attend_triton.triton) else None


def codec_attention(ctx: LoadContext) -> Any:
    """``codec_attention``: "triton" (``ring_attend``: one kernel a layer writes the ring and
    reads each slot's window where it lies; the default on CUDA where Triton imports, elsewhere
    only under Triton's CPU interpreter) or "torch" (the default elsewhere: the ring writes, a
    gather of the step's slots' windows and two float32 einsums a layer) -> the codec stream's
    ``attend`` (None for "torch"). The codec step at 1,024 rows 31.6 against 45.0 ms (a8fb659b,
    docs/performance.md)."""
    from models.qwen3_tts import ring_attend_triton
    from models.triton_setting import triton_asked

    default = "triton" if ctx.device.startswith("cuda") and ring_attend_triton.triton is not None else "torch"
    return ring_attend_triton.ring_attend if triton_asked(ctx, "codec_attention", default, "torch",
                                                           ring_attend_triton.triton) else None


def triton_available() -> bool:
    """Whether Triton imports here (it comes with CUDA torch; a CPU install need not have it)."""
    from models.qwen3_tts import conv_triton

    return conv_triton.triton is not None


def build_qwen3_backend(model_path_or_id: str, **kwargs: Any) -> LMBackend:
    """``build_lm_backend`` for Qwen3-TTS (the runtime's keywords and ``codec_dtype``)."""
    from engine.llm.build import build_lm_backend

    return build_lm_backend(load, model_path_or_id, **kwargs)
