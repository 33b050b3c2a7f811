"""Load VoxCPM2 (language side, AudioVAE, tokenizer) from the released layout or at random, with
independent dtypes and an optional LoRA folded in (docs/models/voxcpm2.md, "Loading").
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from models.voxcpm2.config import PRESETS, VoxCPM2Config
from models.voxcpm2.lora import DEFAULT_ALPHA, fold_lora, read_lora
from models.voxcpm2.model import VoxCPM2Model
from models.voxcpm2.prompt import TextTokenizer
from models.voxcpm2.vae import AudioVAE

__all__ = ["DEFAULT_HUB_ID", "Loaded", "fold_weight_norm", "load_config", "load_voxcpm2", "init_random_"]

DEFAULT_HUB_ID = "openbmb/VoxCPM2"
_PATTERNS = ["config.json", "model.safetensors", "pytorch_model.bin", "audiovae.safetensors", "audiovae.pth",
             "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]


@dataclass
class Loaded:
    model: VoxCPM2Model
    vae: AudioVAE
    tokenizer: TextTokenizer | None  # None for a dummy preset without tokenizer files
    config: VoxCPM2Config
    lora_modules: tuple[str, ...] = ()


def load_config(d: str | Path) -> VoxCPM2Config:
    f = Path(d) / "config.json"
    if not f.is_file():
        raise FileNotFoundError(f"model directory {str(d)!r} has no config.json")
    return VoxCPM2Config.from_hf_dict(json.loads(f.read_text()))


def _read(d: Path, names: tuple[str, str], what: str) -> dict[str, torch.Tensor]:
    st, pt = (d / n for n in names)
    if st.is_file():
        from safetensors.torch import load_file

        return load_file(str(st))
    if pt.is_file():
        ckpt = torch.load(str(pt), map_location="cpu", weights_only=True)
        return ckpt.get("state_dict", ckpt)
    raise FileNotFoundError(f"{what}: neither {st.name} nor {pt.name} in {str(d)!r}")


def fold_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``X.weight_g`` + ``X.weight_v`` -> ``X.weight`` (torch's own ``_weight_norm``, dim 0)."""
    out = {}
    for k, v in state.items():
        if k.endswith(".weight_g"):
            continue
        if k.endswith(".weight_v"):
            base = k[: -len(".weight_v")]
            g = state[base + ".weight_g"]
            out[base + ".weight"] = torch._weight_norm(v.float(), g.float(), 0)
        else:
            out[k] = v
    return out


def _assign(module: nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    expected = set(module.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"{what} does not match its config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    module.load_state_dict(state, assign=True, strict=True)


def _cast(state: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device | str,
          keep: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    return {k: (v.to(device, dtype) if v.is_floating_point() and not k.startswith(keep) else v.to(device))
            for k, v in state.items()}


@torch.no_grad()
def init_random_(model: VoxCPM2Model, vae: AudioVAE, *, seed: int = 0, std: float = 0.02) -> None:
    """Random weights in place (``--load-format dummy``): see the module docstring."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name.endswith("bias"):
            p.zero_()
        else:
            p.copy_(torch.randn(p.shape, generator=gen).mul_(std).to(p.device, p.dtype))
    torch.manual_seed(seed)
    for m in vae.modules():
        if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d)):
            m.reset_parameters()
    for name, p in vae.named_parameters():
        if name.endswith("alpha") or name.endswith("scale_embed.weight"):
            p.fill_(1.0)
        elif name.endswith(("bias_embed.weight", "cond_embed.weight")):
            p.zero_()
    if hasattr(vae.decoder, "sr_bin_boundaries"):
        vae.decoder.sr_bin_boundaries.copy_(torch.tensor(vae.config.sr_bin_boundaries, dtype=torch.int32))


def _build(config: VoxCPM2Config) -> tuple[VoxCPM2Model, AudioVAE]:
    with torch.device("meta"):
        return VoxCPM2Model(config), AudioVAE(config.vae)


def _finish(model: VoxCPM2Model, vae: AudioVAE, device: torch.device | str) -> tuple[VoxCPM2Model, AudioVAE]:
    model.setup_rope(device)
    return model.eval().requires_grad_(False), vae.eval().requires_grad_(False)


def load_voxcpm2(path_or_id: str | os.PathLike = DEFAULT_HUB_ID, *, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.bfloat16, vae_decoder_dtype: torch.dtype = torch.float32,
                 load_format: str = "auto", lora: str | os.PathLike | None = None, lora_alpha: float | None = None,
                 seed: int = 0, cache_dir: str | None = None) -> Loaded:
    """``Loaded(model, vae, tokenizer, config)``, eval, on ``device``.

    ``load_format="dummy"``: ``path_or_id`` is a preset name or a folder with a config.json (and
    maybe a tokenizer); anything else means the ``voxcpm2`` preset.
    """
    if load_format not in ("auto", "dummy"):
        raise ValueError(f"load_format must be 'auto' or 'dummy', got {load_format!r}")
    key = str(path_or_id)
    tokenizer: TextTokenizer | None = None
    if load_format == "dummy":
        d = Path(os.path.expanduser(key))
        if key in PRESETS:
            config = PRESETS[key]
        elif d.is_dir() and (d / "config.json").is_file():
            config = load_config(d)
            tokenizer = TextTokenizer.from_dir(d) if (d / "tokenizer.json").is_file() else None
        else:
            config = PRESETS["voxcpm2"]
        model, vae = _build(config)
        model.to_empty(device=device)
        vae.to_empty(device=device)
        init_random_(model, vae, seed=seed)
    else:
        from models.orpheus.loader import resolve_dir

        d = resolve_dir(path_or_id, allow_patterns=_PATTERNS, what="VoxCPM2 model", cache_dir=cache_dir)
        config = load_config(d)
        model, vae = _build(config)
        _assign(model, _cast(_read(d, ("model.safetensors", "pytorch_model.bin"), "VoxCPM2 model"), dtype, device),
                f"checkpoint {str(d)!r}")
        vstate = fold_weight_norm(_read(d, ("audiovae.safetensors", "audiovae.pth"), "VoxCPM2 AudioVAE"))
        _assign(vae, _cast(vstate, torch.float32, device), f"AudioVAE of {str(d)!r}")
        tokenizer = TextTokenizer.from_dir(d)
    model.to(dtype)
    vae.encoder.to(torch.float32)
    vae.decoder.to(vae_decoder_dtype)
    lora_modules: tuple[str, ...] = ()
    if lora is not None:
        adapter, file_alpha = read_lora(lora)
        alpha = lora_alpha if lora_alpha is not None else (file_alpha if file_alpha is not None else DEFAULT_ALPHA)
        lora_modules = tuple(fold_lora(model, adapter, alpha=alpha))
    model, vae = _finish(model, vae, device)
    return Loaded(model, vae, tokenizer, config, lora_modules)
