"""Load Qwen3-TTS (talker + code predictor, speaker encoder, codec decoder, tokenizer) from a
checkpoint folder, a hub id, or a preset with random weights (``load_format="dummy"``, its codec
made audible); the folder layout: docs/models/qwen3_tts.md, "Checkpoint layout".
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from models.qwen3_tts.codec import Codec
from models.qwen3_tts.config import PRESETS, Qwen3TTSConfig
from models.qwen3_tts.prompt import TextTokenizer
from models.qwen3_tts.talker import Qwen3TTSModel

__all__ = ["DEFAULT_HUB_ID", "load_config", "load_qwen3_tts", "init_random_", "Loaded"]

DEFAULT_HUB_ID = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"
_PATTERNS = ["config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer*", "vocab.json",
             "merges.txt", "special_tokens_map.json", "generation_config.json", "speech_tokenizer/*"]


class Loaded(tuple):
    """(model, codec, tokenizer, config); tokenizer is None for a dummy load without tokenizer files."""

    __slots__ = ()

    def __new__(cls, model: Qwen3TTSModel, codec: Codec, tokenizer: TextTokenizer | None,
                config: Qwen3TTSConfig) -> Loaded:
        return super().__new__(cls, (model, codec, tokenizer, config))

    model = property(lambda self: self[0])
    codec = property(lambda self: self[1])
    tokenizer = property(lambda self: self[2])
    config = property(lambda self: self[3])


def load_config(d: str | Path) -> Qwen3TTSConfig:
    d = Path(d)
    f = d / "config.json"
    if not f.is_file():
        raise FileNotFoundError(f"model directory {str(d)!r} has no config.json")
    st = d / "speech_tokenizer" / "config.json"
    return Qwen3TTSConfig.from_hf_dict(json.loads(f.read_text()),
                                       json.loads(st.read_text()) if st.is_file() else None)


def _read_safetensors(d: Path, device: torch.device | str, dtype: torch.dtype, *, prefix: str = "",
                      what: str) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    index = d / "model.safetensors.index.json"
    if index.is_file():
        files = [d / n for n in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    else:
        files = sorted(d.glob("*.safetensors"))
    missing = [str(f) for f in files if not f.is_file()]
    if not files or missing:
        raise FileNotFoundError(f"{what}: no safetensors weights in {str(d)!r} {missing or ''}".rstrip())
    state = {}
    for f in files:
        with safe_open(str(f), framework="pt", device=str(device)) as sf:
            for k in sf.keys():
                if k.startswith(prefix):
                    t = sf.get_tensor(k)
                    state[k[len(prefix):]] = t.to(dtype) if t.is_floating_point() else t
    return state


def _assign(module: nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    expected = set(module.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"{what} does not match its config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    module.load_state_dict(state, assign=True, strict=True)


@torch.no_grad()
def init_random_(model: Qwen3TTSModel, codec: Codec, *, seed: int = 0, std: float = 0.02) -> None:
    """Random weights in place (``--load-format dummy``): see the module docstring for the codec."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def normal_(p: torch.Tensor, s: float) -> None:
        p.copy_(torch.randn(p.shape, generator=gen).mul_(s).to(p.device, p.dtype))

    for name, p in model.talker.named_parameters():
        if "norm" in name:
            p.fill_(1.0)
        elif name.endswith("bias"):
            p.zero_()
        else:
            normal_(p, std)
    torch.manual_seed(seed)
    if model.speaker_encoder is not None:
        for m in model.speaker_encoder.modules():
            if isinstance(m, nn.Conv1d):
                m.reset_parameters()
    for m in codec.modules():
        if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d, nn.Linear, nn.LayerNorm)):
            m.reset_parameters()
    for name, p in codec.named_parameters():
        if name.endswith("embedding_sum"):
            normal_(p, 1.0)
        elif name.endswith("cluster_usage"):
            p.fill_(1.0)
        elif name.endswith(("alpha", "beta")):
            p.zero_()
        elif name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name.endswith("layer_scale.scale"):
            p.fill_(codec.config.layer_scale_initial_scale)
        elif name.endswith("gamma"):
            p.fill_(1e-6)


def _build(config: Qwen3TTSConfig) -> tuple[Qwen3TTSModel, Codec]:
    with torch.device("meta"):
        return Qwen3TTSModel(config), Codec(config.codec)


def _finish(model: Qwen3TTSModel, codec: Codec, device: torch.device | str) -> tuple[Qwen3TTSModel, Codec]:
    model.talker.setup_rope(device)
    model.talker.code_predictor.fuse_()  # fewer kernels in the frame head's 15 steps
    codec.setup_rope(device)
    return model.eval().requires_grad_(False), codec.eval().requires_grad_(False)


def load_qwen3_tts(path_or_hub_id: str | os.PathLike = DEFAULT_HUB_ID, *, device: torch.device | str = "cpu",
                   dtype: torch.dtype = torch.bfloat16, codec_dtype: torch.dtype = torch.float32,
                   load_format: str = "auto", seed: int = 0, cache_dir: str | None = None) -> Loaded:
    """Return ``Loaded(model, codec, tokenizer, config)``, eval, on ``device``.

    ``load_format="dummy"``: ``path_or_hub_id`` is a preset name or a folder whose config.json
    (and tokenizer, if any) is used; anything else (a hub id) the preset of its size and kind.
    """
    if load_format not in ("auto", "dummy"):
        raise ValueError(f"load_format must be 'auto' or 'dummy', got {load_format!r}")
    key = str(path_or_hub_id)
    if load_format == "dummy":
        d = Path(os.path.expanduser(key))
        if key in PRESETS:
            config, tokenizer = PRESETS[key], None
        elif d.is_dir() and (d / "config.json").is_file():
            config = load_config(d)
            has_tok = (d / "tokenizer.json").is_file() or (d / "vocab.json").is_file()
            tokenizer = TextTokenizer.from_dir(d) if has_tok else None
        else:  # a hub id: the preset of its size and kind (Qwen/Qwen3-TTS-12Hz-0.6B-Base -> 0.6b-base)
            name = key.lower()
            size = "0.6b" if "0.6b" in name else "1.7b"
            kind = "base" if name.endswith("base") else "customvoice"
            config, tokenizer = PRESETS[f"qwen3-tts-{size}-{kind}"], None
        model, codec = _build(config)
        model.to_empty(device=device)
        codec.to_empty(device=device)
        init_random_(model, codec, seed=seed)
        model.to(dtype)
        codec.to(codec_dtype)
        return Loaded(*_finish(model, codec, device), tokenizer, config)
    from models.orpheus.loader import resolve_dir

    d = resolve_dir(path_or_hub_id, allow_patterns=_PATTERNS, what="Qwen3-TTS model", cache_dir=cache_dir)
    config = load_config(d)
    model, codec = _build(config)
    _assign(model, _read_safetensors(d, device, dtype, what="Qwen3-TTS model"), f"checkpoint {str(d)!r}")
    st = d / "speech_tokenizer"
    _assign(codec, _read_safetensors(st, device, codec_dtype, prefix="decoder.", what="speech tokenizer"),
            f"speech tokenizer {str(st)!r}")
    model, codec = _finish(model, codec, device)
    return Loaded(model, codec, TextTokenizer.from_dir(d), config)
