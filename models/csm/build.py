"""Loading the CSM program for the runtime (``--model csm``, ``sesame/csm-1b``, ``csm-tiny``); its
program settings (``codec_dtype``, ``csm_context_frames``, ``mimi_attention``): docs/models/csm.md, "Serving".
"""

from __future__ import annotations

import logging
from typing import Any

from engine.llm.backend import LMBackend
from engine.llm.program import KVShape, LoadContext, ProgramModel, ServingDefaults, codec_dtype as program_codec_dtype, model_len

__all__ = ["CSM_DEFAULTS", "build_csm_backend", "load"]

log = logging.getLogger(__name__)

# Not yet measured on a GPU: no decode cap (every running stream decodes each step).
CSM_DEFAULTS = ServingDefaults(decode_cap=0, decode_cap_fp8=0)


def load(ctx: LoadContext) -> ProgramModel:
    from models.csm.head import CsmForward, CsmHead, CsmSlots
    from models.csm.loader import load_csm
    from models.csm.program import CsmProgram
    from models.csm.prompt import StandInTokenizer
    from models.csm.voices import FramePool, VoiceCache
    from models.mimi.attend_triton import attention_setting as mimi_attention_setting
    from models.mimi.stream import MimiDecodeStream

    codec_dtype = program_codec_dtype(ctx)
    if ctx.quantise_fp8:
        raise ValueError("fp8 weights (--quantization fp8) are not supported for CSM yet")
    frames = int(ctx.setting("csm_context_frames", 32768))
    if frames < 2:
        raise ValueError(f"csm_context_frames must be at least 2, got {frames}")
    loaded = load_csm(ctx.model_id, device=ctx.device, dtype=ctx.dtype, codec_dtype=codec_dtype,
                      load_format=ctx.load_format, max_seq_len=ctx.max_model_len)
    model, config = loaded.model, loaded.config
    row_len = model_len(ctx, config.backbone.max_position_embeddings, extendable=True)
    if row_len > config.backbone.max_position_embeddings:
        log.warning("max_model_len %d exceeds the %d positions CSM was trained on: longer conversations run "
                    "past them", row_len, config.backbone.max_position_embeddings)
    pool = FramePool(frames, config.num_codebooks, ctx.device)
    slots = CsmSlots(model, ctx.max_num_seqs, pool.table, ctx.device)
    codec = MimiDecodeStream(loaded.mimi, ctx.max_num_seqs, num_codebooks=config.num_codebooks, device=ctx.device,
                             dtype=codec_dtype, attention=mimi_attention_setting(ctx))
    program = CsmProgram(model, config, loaded.tokenizer or StandInTokenizer(), slots=slots, voices=VoiceCache(pool),
                         mimi=loaded.mimi, codec_stream=codec, max_model_len=row_len,
                         model_name=ctx.model_id)
    if ctx.use_graphs:
        program.codec.capture(ctx.max_num_seqs, desc="mimi codec graphs")
    b = config.backbone
    shape = KVShape(b.num_hidden_layers, b.num_attention_heads, b.num_key_value_heads, b.head_dim, b.vocab_size)
    return ProgramModel(program=program, model=CsmForward(model, slots), kv_shape=shape, head=CsmHead(model, slots),
                        uses_token_rows=True, supports_mixed_graphs=False, defaults=CSM_DEFAULTS,
                        max_model_len=row_len)


def build_csm_backend(model_path_or_id: str, **kwargs: Any) -> LMBackend:
    """``build_lm_backend`` for CSM (the runtime's keywords and the settings above)."""
    from engine.llm.build import build_lm_backend

    return build_lm_backend(load, model_path_or_id, **kwargs)
