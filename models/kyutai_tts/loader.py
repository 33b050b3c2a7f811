"""Load Kyutai TTS (LM + depth transformer + conditioners, Mimi, SentencePiece) and its voices
from a checkpoint folder or the hub, or random weights (``load_format="dummy"``); both of
moshi's attention layouts load (docs/models/kyutai_tts.md, "Checkpoint and config").
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any, NamedTuple

import torch
from models.kyutai_tts.config import PRESETS, KyutaiTTSConfig, load_config
from models.kyutai_tts.lm import KyutaiLM
from models.kyutai_tts.text import TextTokenizer
from models.mimi.codec import Mimi
from models.mimi.loader import load_mimi, normalize_keys

__all__ = ["DEFAULT_HUB_ID", "VOICES_HUB_ID", "Loaded", "HashTokenizer", "load_kyutai_tts", "load_lm_weights", "load_voice",
           "init_random_"]

DEFAULT_HUB_ID = "kyutai/tts-1.6b-en_fr"
VOICES_HUB_ID = "kyutai/tts-voices"  # the published voices (Kyutai's server reads them from here)
_PATTERNS = ["config.json", "*.safetensors", "*.model"]


class Loaded(NamedTuple):
    lm: KyutaiLM
    mimi: Mimi
    tokenizer: Any  # TextTokenizer, or HashTokenizer for a dummy load without one
    config: KyutaiTTSConfig
    root: Path | None = None  # the checkpoint folder (None: a preset)


class HashTokenizer:
    """Stand-in tokenizer for ``--load-format dummy`` without a SentencePiece file: a word is cut
    into pieces of up to 4 characters, each mapped by crc32 to an id in [4, vocab) (deterministic;
    about the token counts of the real 8k vocabulary)."""

    unk_id = 0

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode(self, word: str) -> list[int]:
        pieces = [word[i:i + 4] for i in range(0, len(word), 4)] or [""]
        return [4 + zlib.crc32(p.encode()) % (self.vocab_size - 4) for p in pieces]

    def is_unknown(self, ids: list[int]) -> bool:
        return False


def load_voice(path: str | os.PathLike) -> torch.Tensor:
    """A voice embedding file -> [speaker_dim, frames] float32."""
    from safetensors.torch import load_file

    state = load_file(str(path))
    if "speaker_wavs" not in state:
        raise ValueError(f"{str(path)!r} has no 'speaker_wavs' tensor (not a Kyutai voice embedding)")
    t = state["speaker_wavs"]
    if t.dim() != 3 or t.shape[0] != 1:
        raise ValueError(f"{str(path)!r}: speaker_wavs must be [1, dim, frames], got {tuple(t.shape)}")
    return t[0].float()


@torch.no_grad()
def init_random_(lm: KyutaiLM, *, seed: int = 0, std: float = 0.02) -> None:
    """Random LM weights in place (``--load-format dummy``)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, p in lm.named_parameters():
        if name.endswith("alpha") or (name.endswith("weight") and "norm_cross" in name):
            p.fill_(1.0)
        elif name.endswith("bias"):
            p.zero_()
        else:
            p.copy_(torch.randn(p.shape, generator=gen).mul_(std).to(p.device, p.dtype))


def _depformer_mults(config: KyutaiTTSConfig) -> dict[str, int]:
    n = config.lm.num_depformer_weights
    return {f"depformer.layers.{i}.self_attn.": n for i in range(config.lm.depformer_num_layers)}


def _cast(lm: KyutaiLM, dtype: torch.dtype) -> KyutaiLM:
    lm.to(dtype)
    lm.condition_provider.float()
    return lm


def load_lm_weights(lm: KyutaiLM, file: Path, *, device: torch.device | str, dtype: torch.dtype) -> None:
    """Assign an LM safetensors file onto ``lm`` (built on the meta device), strictly."""
    from safetensors.torch import load_file

    state = normalize_keys(load_file(str(file), device=str(device)), _depformer_mults(lm.config))
    expected = set(lm.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"LM checkpoint {str(file)!r} does not match its config: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    cast = {k: (v.float() if k.startswith("condition_provider.") else v.to(dtype)) if v.is_floating_point() else v
            for k, v in state.items()}
    lm.load_state_dict(cast, assign=True, strict=True)


def _finish(lm: KyutaiLM, device: torch.device | str) -> KyutaiLM:
    lm.delays = torch.tensor(lm.config.lm.delays, dtype=torch.int64, device=device)  # (non-persistent)
    lm.join_depformer_in()  # one input projection per frame (decode_frame)
    lm.join_audio_emb()  # one look-up of a frame's codes (KyutaiLM.embed)
    lm.fold_depformer_emb()  # a codebook step's input embedding read by its fused norm (decode_frame)
    lm.fold_text_emb()  # the text stream's two tokens read from one table (KyutaiLM.embed)
    return lm.eval().requires_grad_(False)


def load_kyutai_tts(path_or_hub_id: str | os.PathLike = DEFAULT_HUB_ID, *, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.bfloat16, mimi_dtype: torch.dtype = torch.float32,
                    load_format: str = "auto", seed: int = 0, cache_dir: str | None = None,
                    n_q: int | None = None, voice_frames: int = 125) -> Loaded:
    """``Loaded(lm, mimi, tokenizer, config)``, eval, on ``device``; ``n_q``: codebooks to generate
    (default: the config's ``tts.n_q``, Kyutai's server's 24, capped by the checkpoint's 32);
    ``voice_frames``: frames of the voice embeddings it will be given (125 for the published ones).

    ``load_format="dummy"``: ``path_or_hub_id`` is a preset name or a folder whose config.json
    (and tokenizer, if any) is used; anything else means the 1.6B preset."""
    if load_format not in ("auto", "dummy"):
        raise ValueError(f"load_format must be 'auto' or 'dummy', got {load_format!r}")
    key = str(path_or_hub_id)
    if load_format == "dummy":
        d = Path(os.path.expanduser(key))
        tokenizer: Any = None
        if key in PRESETS:
            config = PRESETS[key]
        elif d.is_dir() and (d / "config.json").is_file():
            config = load_config(d, voice_frames=voice_frames)
            if (d / config.tokenizer_name).is_file():
                tokenizer = TextTokenizer.from_file(d / config.tokenizer_name)
        else:
            config = PRESETS["tts-1.6b-en_fr"]
        if n_q is not None:
            config = config.with_tts(n_q=n_q)
        with torch.device("meta"):
            lm = KyutaiLM(config)
        lm.to_empty(device=device)
        init_random_(lm, seed=seed)
        mimi = load_mimi(config=config.mimi, load_format="dummy", device=device, dtype=mimi_dtype, seed=seed)
        return Loaded(_finish(_cast(lm, dtype), device), mimi, tokenizer or HashTokenizer(config.lm.text_card), config,
                      d if d.is_dir() else None)
    from models.orpheus.loader import resolve_dir

    d = resolve_dir(path_or_hub_id, allow_patterns=_PATTERNS, what="Kyutai TTS model", cache_dir=cache_dir)
    config = load_config(d, voice_frames=voice_frames)
    if n_q is not None:
        config = config.with_tts(n_q=n_q)
    with torch.device("meta"):
        lm = KyutaiLM(config)
    load_lm_weights(lm, d / config.moshi_name, device=device, dtype=dtype)
    mimi = load_mimi(d / config.mimi_name, config=config.mimi, device=device, dtype=mimi_dtype)
    tokenizer = TextTokenizer.from_file(d / config.tokenizer_name)
    return Loaded(_finish(lm, device), mimi, tokenizer, config, d)
