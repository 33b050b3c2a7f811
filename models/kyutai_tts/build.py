"""Loading the Kyutai TTS program for the runtime (``--model kyutai-tts``, ``kyutai/tts-...``).

Program settings (``LoadContext.setting``; keywords of ``build_lm_backend``):
- ``kyutai_n_q``: codebooks generated and decoded (default: the config's, 24 as Kyutai's
  server; 8..32 trade quality for speed);
- ``voice_dir``: a folder of voice embeddings; default: the checkpoint folder's ``voices/`` if
  it has one, else the hub snapshot of ``kyutai/tts-voices`` (this checkpoint's files only, from
  the cache or downloaded), as Kyutai's server does; with ``--load-format dummy`` and no folder,
  four random voices ``random-0..3``;
- ``voice_bank_size``: voices whose cross-attention keys/values are held at once (default 8);
- ``codec_dtype``: Mimi's dtype ("auto": bfloat16 on CUDA, float32 on the CPU).
"""

from __future__ import annotations

from typing import Any

from engine.llm.backend import LMBackend
from engine.llm.program import LoadContext, ProgramModel, ServingDefaults

__all__ = ["KYUTAI_DEFAULTS", "build_kyutai_backend", "load"]

# Not yet measured on a GPU: no decode cap (every running stream decodes each step).
KYUTAI_DEFAULTS = ServingDefaults(decode_cap=0, decode_cap_fp8=0)
DEFAULT_VOICE = "unmute-prod-website/default_voice.wav"  # Kyutai's server default (configs/config-tts.toml)


def load(ctx: LoadContext) -> ProgramModel:
    import torch

    from models.kyutai_tts.conditioning import VoiceBank
    from models.kyutai_tts.device_machine import DeviceMachine
    from models.kyutai_tts.head import KyutaiHead
    from models.kyutai_tts.lm import SlotInputs
    from models.kyutai_tts.loader import load_kyutai_tts
    from models.kyutai_tts.machine import MachineParams
    from models.kyutai_tts.program import KyutaiProgram, VoiceTable
    from models.mimi.stream import MimiDecodeStream

    name = ctx.setting("codec_dtype", "auto")
    if name == "auto":
        name = "bfloat16" if ctx.device == "cuda" else "float32"
    if name not in ("float32", "bfloat16"):
        raise ValueError(f"codec_dtype must be auto, float32 or bfloat16, got {name!r}")
    codec_dtype = getattr(torch, name)
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
                     lmc.num_heads, lmc.head_dim, device=ctx.device, dtype=ctx.dtype)
    slots = SlotInputs(config, ctx.max_num_seqs, bank, device=ctx.device, dtype=ctx.dtype)
    lm.attach(slots, config.tts.n_q)
    tts = config.tts
    params = MachineParams(card=config.text_card_in, second_stream_ahead=tts.second_stream_ahead,
                           max_padding=tts.max_padding, initial_padding=tts.initial_padding)
    machine = DeviceMachine(params, ctx.max_num_seqs, ctx.device)
    head = KyutaiHead(lm, slots, machine)
    codec = MimiDecodeStream(loaded.mimi, ctx.max_num_seqs, num_codebooks=tts.n_q, device=ctx.device,
                             dtype=codec_dtype)
    program = KyutaiProgram(lm, config, loaded.tokenizer, slots=slots, machine=machine,
                            voices=VoiceTable(lm, bank, voices), codec_stream=codec, model_name=ctx.model_id,
                            default_voice=DEFAULT_VOICE)
    if ctx.use_graphs:
        program.codec.capture(ctx.max_num_seqs, desc="mimi codec graphs")
    shape = _KVShape(lmc.num_layers, lmc.num_heads, lmc.num_heads, lmc.head_dim, lmc.text_card)
    return ProgramModel(program=program, model=lm, kv_shape=shape, head=head, uses_token_rows=True,
                        supports_mixed_graphs=False, defaults=KYUTAI_DEFAULTS)


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


class _KVShape:
    """The KV cache's shape for the runtime (``engine.llm.model_runner``)."""

    def __init__(self, layers: int, heads: int, kv_heads: int, head_dim: int, vocab_size: int) -> None:
        self.num_hidden_layers = layers
        self.num_attention_heads = heads
        self.num_key_value_heads = kv_heads
        self.head_dim = head_dim
        self.vocab_size = vocab_size


def build_kyutai_backend(model_path_or_id: str, **kwargs: Any) -> LMBackend:
    """``build_lm_backend`` for Kyutai TTS (the runtime's keywords and the settings above)."""
    from engine.llm.build import build_lm_backend

    return build_lm_backend(load, model_path_or_id, **kwargs)
