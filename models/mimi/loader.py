"""Load a Mimi codec from moshi's safetensors checkpoint, or build one with random weights
(``load_format="dummy"``); docs/models/kyutai_tts.md, "The Mimi codec".
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from models.mimi.codec import Mimi
from models.mimi.config import MIMI, MimiConfig

__all__ = ["MIMI_FILE", "load_mimi", "init_random_", "normalize_keys"]

MIMI_FILE = "tokenizer-e351c8d8-checkpoint125.safetensors"


def normalize_keys(state: dict[str, torch.Tensor], mults: dict[str, int] | None = None) -> dict[str, torch.Tensor]:
    """moshi's legacy attention keys -> ``in_projs.<i>.weight`` / ``out_projs.<i>.weight``.

    ``mults`` maps an attention module's prefix (``...self_attn.``) to its number of per-step
    weight sets (default 1): a stacked ``in_proj_weight`` [mult * 3D, D] is split in ``mult``."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        for legacy, target in (("in_proj_weight", "in_projs.{i}.weight"), ("in_proj.weight", "in_projs.{i}.weight"),
                               ("out_proj.weight", "out_projs.{i}.weight")):
            if key.endswith("." + legacy):
                prefix = key[: len(key) - len(legacy)]
                mult = (mults or {}).get(prefix, 1)
                for i, part in enumerate(value.view(mult, -1, *value.shape[1:])):
                    out[prefix + target.format(i=i)] = part
                break
        else:
            out[key] = value
    return out


@torch.no_grad()
def init_random_(mimi: Mimi, *, seed: int = 0) -> None:
    """Audible random weights in place (see the module docstring)."""
    torch.manual_seed(seed)
    for m in mimi.modules():
        if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d, nn.Linear, nn.LayerNorm)):
            m.reset_parameters()
    gen = torch.Generator().manual_seed(seed)
    for name, b in mimi.named_buffers():
        if name.endswith("embedding_sum"):
            b.copy_(torch.randn(b.shape, generator=gen).to(b))
        elif name.endswith(("cluster_usage", "_initialized")):
            b.fill_(1.0)
    for name, p in mimi.named_parameters():
        if name.endswith("layer_scale_1.scale") or name.endswith("layer_scale_2.scale"):
            p.fill_(mimi.config.transformer.layer_scale)


def _find_file(path: Path) -> Path:
    if path.is_file():
        return path
    if path.is_dir():
        named = path / MIMI_FILE
        if named.is_file():
            return named
        found = sorted(path.glob("tokenizer-*.safetensors"))
        if found:
            return found[0]
    raise FileNotFoundError(f"no Mimi checkpoint at {str(path)!r} (expected {MIMI_FILE} or a .safetensors file)")


def load_mimi(path: str | os.PathLike | None = None, *, config: MimiConfig = MIMI, device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32, load_format: str = "auto", seed: int = 0) -> Mimi:
    """A Mimi codec, eval, on ``device``: from ``path`` (a safetensors file, or a directory holding
    one), or random (``load_format="dummy"``; ``path`` is then ignored)."""
    if load_format not in ("auto", "dummy"):
        raise ValueError(f"load_format must be 'auto' or 'dummy', got {load_format!r}")
    if load_format == "dummy":
        mimi = Mimi(config)
        init_random_(mimi, seed=seed)
        return mimi.to(device=device, dtype=dtype).eval().requires_grad_(False)
    if path is None:
        raise ValueError("load_mimi: a checkpoint path is needed unless load_format='dummy'")
    from safetensors.torch import load_file

    f = _find_file(Path(os.path.expanduser(str(path))))
    state = normalize_keys(load_file(str(f), device=str(device)))
    with torch.device("meta"):
        mimi = Mimi(config)
    expected = set(mimi.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"Mimi checkpoint {str(f)!r} does not match its config: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    mimi.load_state_dict({k: v.to(dtype) for k, v in state.items()}, assign=True, strict=True)
    return mimi.eval().requires_grad_(False)
