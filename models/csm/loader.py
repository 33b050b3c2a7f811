"""Load CSM (backbone, depth decoder, Mimi, tokenizer) from a checkpoint, the hub, or nothing
(the folder's layout: docs/models/csm.md, "Checkpoint").
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from models.csm.codec import moshi_state
from models.csm.config import PRESETS, CsmConfig, load_config
from models.csm.model import CsmModel
from models.csm.prompt import TextTokenizer
from models.mimi.codec import Mimi

__all__ = ["DEFAULT_HUB_ID", "Loaded", "init_random_", "load_csm"]

DEFAULT_HUB_ID = "sesame/csm-1b"
_PATTERNS = ["config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer*", "special_tokens_map.json",
             "generation_config.json"]
_AUDIO_TABLE = "backbone_model.embed_tokens.embed_audio_tokens.weight"
_DEPTH_TABLE = "depth_decoder.model.embed_tokens.weight"


@dataclass
class Loaded:
    model: CsmModel
    mimi: Mimi
    tokenizer: TextTokenizer | None  # None: a dummy load without tokenizer files
    config: CsmConfig
    root: Path | None = None  # the checkpoint folder (None: a preset)


def _read_safetensors(d: Path, device: torch.device | str) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    index = d / "model.safetensors.index.json"
    if index.is_file():
        files = [d / n for n in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    else:
        files = sorted(d.glob("*.safetensors"))
    missing = [str(f) for f in files if not f.is_file()]
    if not files or missing:
        raise FileNotFoundError(f"CSM model: no safetensors weights in {str(d)!r} {missing or ''}".rstrip())
    state: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt", device=str(device)) as sf:
            for k in sf.keys():
                state[k] = sf.get_tensor(k)
    return state


def _split(state: dict[str, torch.Tensor], config: CsmConfig, what: str) -> tuple[dict, dict]:
    codec = {k[len("codec_model."):]: v for k, v in state.items() if k.startswith("codec_model.")}
    lm = {k: v for k, v in state.items() if not k.startswith("codec_model.")}
    if config.tie_codebooks_embeddings:  # one table, stored under either name
        table = lm.get(_DEPTH_TABLE, lm.get(_AUDIO_TABLE))
        if table is None:
            raise ValueError(f"{what}: neither {_DEPTH_TABLE} nor {_AUDIO_TABLE} is in the checkpoint")
        lm[_DEPTH_TABLE] = lm[_AUDIO_TABLE] = table
    if not codec:
        raise ValueError(f"{what}: the checkpoint has no codec_model.* weights (the Mimi codec)")
    return lm, codec


def _assign(module: torch.nn.Module, state: dict[str, torch.Tensor], dtype: torch.dtype, what: str) -> None:
    expected = set(module.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"{what} does not match its config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    module.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()},
                           assign=True, strict=True)


@torch.no_grad()
def init_random_(model: CsmModel, *, seed: int = 0, std: float = 0.02) -> None:
    """Random weights in place (``--load-format dummy``): normal(0, std), norms at 1."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            p.copy_(torch.randn(p.shape, generator=gen).mul_(std).to(p.device, p.dtype))


def _tokenizer(d: Path | None) -> TextTokenizer | None:
    if d is not None and (d / "tokenizer.json").is_file():
        return TextTokenizer.from_dir(d)
    return None


def load_csm(path_or_hub_id: str | os.PathLike = DEFAULT_HUB_ID, *, device: torch.device | str = "cpu",
             dtype: torch.dtype = torch.bfloat16, codec_dtype: torch.dtype = torch.float32, load_format: str = "auto",
             max_seq_len: int | None = None, seed: int = 0, cache_dir: str | None = None) -> Loaded:
    """``Loaded(model, mimi, tokenizer, config, root)``, eval, on ``device``.

    ``load_format="dummy"``: ``path_or_hub_id`` is a preset name or a folder whose config.json
    (and tokenizer, if any) is used; anything else (a hub id) the ``csm-1b`` preset."""
    from models.mimi.loader import init_random_ as init_mimi_

    if load_format not in ("auto", "dummy"):
        raise ValueError(f"load_format must be 'auto' or 'dummy', got {load_format!r}")
    key = str(path_or_hub_id)
    if load_format == "dummy":
        d = Path(os.path.expanduser(key))
        root = d if d.is_dir() and (d / "config.json").is_file() else None
        config = load_config(root) if root is not None else PRESETS.get(key, PRESETS["csm-1b"])
        with torch.device("meta"):
            model = CsmModel(config, max_seq_len=max_seq_len)
        model.to_empty(device=device)
        init_random_(model, seed=seed)
        model = model.to(dtype)
        model.setup(device)
        mimi = Mimi(config.mimi)
        init_mimi_(mimi, seed=seed)
        mimi = mimi.to(device=device, dtype=codec_dtype)
        return Loaded(model.eval().requires_grad_(False), mimi.eval().requires_grad_(False), _tokenizer(root),
                      config, root)
    from models.orpheus.loader import resolve_dir

    d = resolve_dir(path_or_hub_id, allow_patterns=_PATTERNS, what="CSM model", cache_dir=cache_dir)
    config = load_config(d)
    lm, codec = _split(_read_safetensors(d, device), config, f"checkpoint {str(d)!r}")
    with torch.device("meta"):
        model = CsmModel(config, max_seq_len=max_seq_len)
        mimi = Mimi(config.mimi)
    _assign(model, lm, dtype, f"checkpoint {str(d)!r}")
    _assign(mimi, moshi_state(codec, mimi), codec_dtype, f"the codec of {str(d)!r}")
    model.setup(device)
    tokenizer = _tokenizer(d)
    if tokenizer is None:
        raise FileNotFoundError(f"CSM model: {str(d)!r} has no tokenizer.json")
    return Loaded(model.eval().requires_grad_(False), mimi.eval().requires_grad_(False), tokenizer, config, d)

