"""Loading the VoxCPM2 program for the runtime (``--model voxcpm2``, ``openbmb/VoxCPM2``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from engine.llm.backend import LMBackend
from engine.llm.program import LoadContext, ProgramModel, ServingDefaults, model_len

__all__ = ["VAE_BUCKETS", "VOXCPM2_DEFAULTS", "build_voxcpm2_backend", "load"]

# No decode cap; the decode fill at 64 rows, not 256: jobs due within the horizon always
# decode, and only 64 rows' worth of jobs not yet due (the segments generated ahead) fill a
# step. A step's time grows with its rows (the flow-matching head at 64 rows takes a third of
# its time at 256): with 128 streams offered, the fill of 256 ran about 200 rows at 120-140 ms
# a step and admission held some 110 streams (363 refused, TTFA p90 1,123 ms; d678acb7), the
# fill of 64 ran 64 rows at 45-52 ms and admitted all 128, every one on time (TTFA p90 439 ms;
# 0dfc444f). docs/performance.md, "VoxCPM2 on an H200".
VOXCPM2_DEFAULTS = ServingDefaults(decode_cap=0, decode_cap_fp8=0, decode_fill_seqs=64)
# The VAE's batches: the rows whose chunk is due in a step (about 1 in chunk_patches of the
# running rows once streams are staggered; all of them when they start together).
VAE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)


def _dtype(ctx: LoadContext, name: str, default_cuda: str) -> Any:
    import torch

    value = ctx.setting(name, "auto")
    if value == "auto":
        value = default_cuda if ctx.device == "cuda" else "float32"
    if value not in ("float32", "bfloat16"):
        raise ValueError(f"{name} must be auto, float32 or bfloat16, got {value!r}")
    return getattr(torch, value)


def load(ctx: LoadContext) -> ProgramModel:
    """VoxCPM2 on ``ctx.device``: the language side in ``ctx.dtype``, the VAE encoder in float32.

    Settings (``ctx.setting``): ``lora`` (an adapter folded into the weights at load, a path;
    ``lora_alpha``: its alpha when no ``lora_config.json`` gives it), ``vae_decoder_dtype``
    ("auto": bfloat16 on CUDA, float32 on the CPU; "float32", "bfloat16"), ``stream_chunk_patches``
    (patches per streamed VAE chunk, default 4: 640 ms), ``first_chunk_patches`` (a fresh
    sequence's first audio after this many patches, below the chunk, then a patch a step until its
    first whole chunk; 0: off, the first chunk whole; default 1, or 0 for chunks of one patch:
    at 128 streams on an H200 it took the TTFA p90 to 289 ms, against 439-452 ms without it,
    docs/performance.md), ``max_flow_steps`` (the most Euler steps
    a request may ask for, default 10: every row runs that many, the extra ones masked),
    ``max_voice_patches`` (prompt patches a slot holds for a cloned voice, default 384: a voice of
    the voice store's longest, 30 s, with its transcript takes 2 x 188),
    ``vae_max_batch`` (the largest VAE batch replayed at once, default 256)."""
    import torch

    from models.voxcpm2.audio import ChunkDecoder
    from models.voxcpm2.head import PatchHead
    from models.voxcpm2.loader import load_voxcpm2
    from models.voxcpm2.model import SlotFeatures
    from models.voxcpm2.program import StandInTokenizer, VoxCPM2Program

    chunk = int(ctx.setting("stream_chunk_patches", 4))
    first = int(ctx.setting("first_chunk_patches", min(1, chunk - 1)))
    max_steps = int(ctx.setting("max_flow_steps", 10))
    voice_patches = int(ctx.setting("max_voice_patches", 384))
    vae_max_batch = int(ctx.setting("vae_max_batch", 256))
    for name, value, low in (("stream_chunk_patches", chunk, 1), ("max_flow_steps", max_steps, 1),
                             ("max_voice_patches", voice_patches, 0), ("vae_max_batch", vae_max_batch, 1)):
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    if not 0 <= first < chunk:
        raise ValueError(f"first_chunk_patches must be 0 (off) or below stream_chunk_patches ({chunk}), got {first}")
    loaded = load_voxcpm2(ctx.model_id, device=ctx.device, dtype=ctx.dtype,
                          vae_decoder_dtype=_dtype(ctx, "vae_decoder_dtype", "bfloat16"), load_format=ctx.load_format,
                          lora=ctx.setting("lora", None), lora_alpha=ctx.setting("lora_alpha", None))
    model, config = loaded.model, loaded.config
    row_len = model_len(ctx, config.lm.max_position_embeddings)  # (its RoPE table; refused past it)
    if ctx.quantise_fp8:
        from engine.llm.fp8 import quantise_decoder_linears_

        for stack in (model.base_lm, model.residual_lm):  # (the local encoder and DiT stay bf16)
            quantise_decoder_linears_(SimpleNamespace(model=SimpleNamespace(layers=stack.layers,
                                                                            embed_tokens=model.base_lm.embed_tokens)))
    feats = SlotFeatures(ctx.max_num_seqs, voice_patches, config.patch_size, config.feat_dim, device=ctx.device,
                         dtype=torch.float32)
    model.slot_feats = feats
    head = PatchHead(model, feats, max_num_seqs=ctx.max_num_seqs, max_steps=max_steps,
                     ring_patches=2 * chunk + 4)
    decoder = ChunkDecoder(loaded.vae, head.ring, max_slots=ctx.max_num_seqs, chunk_patches=chunk,
                           first_chunk_patches=first)
    tokenizer = loaded.tokenizer or StandInTokenizer(config.lm.vocab_size)
    program = VoxCPM2Program(model, loaded.vae, config, tokenizer, head=head, feats=feats, decoder=decoder,
                             max_model_len=row_len, model_name=ctx.model_id)
    if ctx.use_graphs:
        program.make_vae_graphs([b for b in VAE_BUCKETS if b <= min(ctx.max_num_seqs, vae_max_batch)] or [1])
    lm = config.lm
    shape = SimpleNamespace(num_hidden_layers=model.num_layers, num_attention_heads=lm.num_attention_heads,
                            num_key_value_heads=lm.num_key_value_heads, head_dim=lm.head_dim,
                            vocab_size=lm.vocab_size)
    return ProgramModel(program=program, model=model, kv_shape=shape, head=head, uses_token_rows=True,
                        supports_mixed_graphs=False, defaults=VOXCPM2_DEFAULTS, max_model_len=row_len)


def build_voxcpm2_backend(model_path_or_id: str, **kwargs: Any) -> LMBackend:
    """``build_lm_backend`` for VoxCPM2 (the runtime's keywords and ``load``'s settings)."""
    from engine.llm.build import build_lm_backend

    return build_lm_backend(load, model_path_or_id, **kwargs)
