"""Loading the Kyutai TTS program for the runtime (``--model kyutai-tts``, ``kyutai/tts-...``).

Its settings (``kyutai_n_q``, ``voice_dir``, ``voice_bank_size``, ``codec_dtype``, ``kyutai_compile``,
``kyutai_depth_attention``, ``kyutai_cross_attention``, ``kyutai_sampling``, ``kyutai_depth_gemm``,
``mimi_attention``; read with ``LoadContext.setting``) are in docs/models/kyutai_tts.md, "Serving".
"""

from __future__ import annotations

from typing import Any

from engine.llm.backend import LMBackend
from engine.llm.program import KVShape, LoadContext, ProgramModel, ServingDefaults, codec_dtype as program_codec_dtype

__all__ = ["KYUTAI_DEFAULTS", "build_kyutai_backend", "cross_attention", "depth_attention", "load", "sampling"]

# No decode cap (every running stream may decode each step). A decode fill of 32 rows, not 256:
# a new turn's ~21 steps before its first audio then ride steps of the due rows only, not of
# every running stream (H200, docs/performance.md: TTFA p50/p90 at 128 streams 382/411 ms with
# 32 against 555/658 with 256 on one GPU, 357/398 against 461/518 on another). Light steps, 4 in
# a row (on CUDA; docs/scheduling.md): with the Triton depth attention, TTFA p90 at 256 streams
# 299 and 271 ms against 409 and 335 without either, on two GPUs (7d77926e, 536cb56d).
# The Triton voice cross-attention and top-k draw (the defaults on CUDA below): loaded steps at
# 400 streams 8.8-10.0 ms against 13.3-13.5, TTFA p90 326-401 against 486-518 ms (743e4974,
# 38302929).
KYUTAI_DEFAULTS = ServingDefaults(decode_cap=0, decode_cap_fp8=0, decode_fill_seqs=32, light_steps=4)
DEFAULT_VOICE = "unmute-prod-website/default_voice.wav"  # Kyutai's server default (configs/config-tts.toml)


def load(ctx: LoadContext) -> ProgramModel:
    from models.kyutai_tts.conditioning import VoiceBank
    from models.kyutai_tts.device_machine import DeviceMachine
    from models.kyutai_tts.head import KyutaiHead
    from models.kyutai_tts.lm import SlotInputs
    from models.kyutai_tts.loader import load_kyutai_tts
    from models.kyutai_tts.machine import MachineParams
    from models.kyutai_tts.program import KyutaiProgram, VoiceTable
    from models.mimi.attend_triton import attention_setting as mimi_attention_setting
    from models.mimi.stream import MimiDecodeStream

    codec_dtype = program_codec_dtype(ctx)
    n_q = ctx.setting("kyutai_n_q", None)
    loaded = load_kyutai_tts(ctx.model_id, device=ctx.device, dtype=ctx.dtype, mimi_dtype=codec_dtype,
                             load_format=ctx.load_format, n_q=int(n_q) if n_q else None)
    lm = loaded.lm
    if ctx.quantise_fp8:
        raise ValueError("fp8 weights (--quantization fp8) are not supported for Kyutai TTS")
    voices = _voices(ctx, loaded)
    lm.set_voice_frames(_voice_frames(voices, lm.config.condition.voice_frames))
    config = lm.config
    lmc = config.lm
    bank = VoiceBank(lmc.num_layers, int(ctx.setting("voice_bank_size", 8)), config.condition.cross_len,
                     lmc.num_heads, lmc.head_dim, device=ctx.device, dtype=ctx.dtype,
                     attention=cross_attention(ctx))
    slots = SlotInputs(config, ctx.max_num_seqs, bank, device=ctx.device, dtype=ctx.dtype)
    lm.attach(slots, config.tts.n_q)
    tts = config.tts
    params = MachineParams(card=config.text_card_in, second_stream_ahead=tts.second_stream_ahead,
                           max_padding=tts.max_padding, initial_padding=tts.initial_padding)
    machine = DeviceMachine(params, ctx.max_num_seqs, ctx.device)
    # The depth transformer's codebook step through torch.compile (one fused program for every
    # codebook; default with CUDA graphs: it fuses norms, residual sums and the sampling's
    # pointwise work, a frame of some 1,930 kernels being bound by their number).
    compiled = ctx.setting("kyutai_compile", ctx.use_graphs)  # True/"on", False/"off", or a backend
    if isinstance(compiled, str) and compiled in ("on", "off", "true", "false", "1", "0"):
        compiled = compiled in ("on", "true", "1")
    backend = "inductor" if compiled is True else compiled
    head = KyutaiHead(lm, slots, machine, compile=bool(compiled), compile_backend=backend or "inductor",
                      attention=depth_attention(ctx), sampling=sampling(ctx),
                      gemm=str(ctx.setting("kyutai_depth_gemm", "torch")))
    head.warm_compiled()  # (before the runtime captures its graphs: no compile during serving)
    if compiled:  # the temporal transformer's RoPE and gating product, one kernel each a layer
        lm.compile_backbone(backend)
    codec = MimiDecodeStream(loaded.mimi, ctx.max_num_seqs, num_codebooks=tts.n_q, device=ctx.device,
                             dtype=codec_dtype, attention=mimi_attention_setting(ctx))
    program = KyutaiProgram(lm, config, loaded.tokenizer, slots=slots, machine=machine,
                            voices=VoiceTable(lm, bank, voices), codec_stream=codec, model_name=ctx.model_id,
                            default_voice=DEFAULT_VOICE)
    if ctx.use_graphs:
        program.codec.capture(ctx.max_num_seqs, desc="mimi codec graphs")
    shape = KVShape(lmc.num_layers, lmc.num_heads, lmc.num_heads, lmc.head_dim, lmc.text_card)
    return ProgramModel(program=program, model=lm, kv_shape=shape, head=head, uses_token_rows=True,
                        supports_mixed_graphs=False, defaults=KYUTAI_DEFAULTS)


def depth_attention(ctx: LoadContext) -> str:
    """The depth transformer's attention (``kyutai_depth_attention``): as set, else the Triton
    kernel on CUDA where Triton imports (the frame head 6.48 against 7.61 ms at 128 rows, 7.58
    against 9.37 at 256, 7d77926e) and ``torch``'s SDPA elsewhere."""
    return str(ctx.setting("kyutai_depth_attention", _triton_on_cuda(ctx, "attend_triton", "sdpa")))


def cross_attention(ctx: LoadContext) -> str:
    """The voice cross-attention (``kyutai_cross_attention``): as set, else the Triton kernel on
    CUDA where Triton imports (the temporal transformer 3.25 against 4.94 ms at 128 rows, 4.14
    against 5.84 at 256, 743e4974) and the masked SDPA elsewhere."""
    return str(ctx.setting("kyutai_cross_attention", _triton_on_cuda(ctx, "cross_triton", "sdpa")))


def sampling(ctx: LoadContext) -> str:
    """The frame's top-k draws (``kyutai_sampling``): as set, else the Triton kernel that finds
    the k kept by bisection (``triton-select``) on CUDA where Triton imports (the frame head 3.84
    against 4.72 ms at 1 row and 4.00 against 5.26 at 64 with the sorting kernel, H100 c8097f67;
    the sorting kernel 5.95 against ``torch``'s 6.14 at 128 rows, H200 743e4974) and
    ``torch.topk`` elsewhere."""
    on_cuda = _triton_on_cuda(ctx, "draw_triton", "torch")
    return str(ctx.setting("kyutai_sampling", "triton-select" if on_cuda == "triton" else on_cuda))


def _triton_on_cuda(ctx: LoadContext, module: str, otherwise: str) -> str:
    """"triton" on a CUDA device where ``models.kyutai_tts.<module>`` found Triton, else ``otherwise``."""
    import importlib

    if not ctx.device.startswith("cuda"):
        return otherwise
    return "triton" if importlib.import_module(f"models.kyutai_tts.{module}").triton is not None else otherwise


def _voice_frames(voices: dict[str, Any], default: int) -> int:
    """The frames of the voices (the default voice's file: a header read, no tensor loaded)."""
    import json
    import struct

    first = voices.get(DEFAULT_VOICE, next(iter(voices.values())))
    if not hasattr(first, "open"):
        return int(first.shape[-1]) if hasattr(first, "shape") else default
    with open(first, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    return int(header["speaker_wavs"]["shape"][-1])


def _voices(ctx: LoadContext, loaded: Any) -> dict[str, Any]:
    import torch

    from models.kyutai_tts.loader import VOICES_HUB_ID
    from models.kyutai_tts.program import find_voices

    config = loaded.config
    voice_dir = ctx.setting("voice_dir", None)
    if not voice_dir and loaded.root is not None and (loaded.root / "voices").is_dir():
        voice_dir = loaded.root / "voices"
    if voice_dir:
        return dict(find_voices(voice_dir, config))
    if ctx.load_format == "dummy":
        gen = torch.Generator().manual_seed(0)
        c = config.condition
        return {f"random-{i}": torch.randn(c.speaker_dim, c.voice_frames, generator=gen) for i in range(4)}
    from models.orpheus.loader import resolve_dir

    sig = config.model_id
    pattern = f"**/*.{sig.get('sig')}@{sig.get('epoch')}.safetensors"
    return dict(find_voices(resolve_dir(VOICES_HUB_ID, allow_patterns=[pattern], what="Kyutai TTS voices"), config))


def build_kyutai_backend(model_path_or_id: str, **kwargs: Any) -> LMBackend:
    """``build_lm_backend`` for Kyutai TTS (the runtime's keywords and the settings above)."""
    from engine.llm.build import build_lm_backend

    return build_lm_backend(load, model_path_or_id, **kwargs)
