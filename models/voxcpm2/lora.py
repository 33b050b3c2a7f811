"""Fold a VoxCPM2 LoRA adapter (the reference's format) into the weights once, at load
(docs/models/voxcpm2.md, "Loading").
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

__all__ = ["DEFAULT_ALPHA", "fold_lora", "read_lora"]

DEFAULT_ALPHA = 16.0


def read_lora(path: str | Path) -> tuple[dict[str, torch.Tensor], float | None]:
    """(adapter tensors, alpha from a lora_config.json beside them or None)."""
    p = Path(path)
    d = p if p.is_dir() else p.parent
    if p.is_dir():
        st, ck = p / "lora_weights.safetensors", p / "lora_weights.ckpt"
        p = st if st.is_file() else ck
    if not p.is_file():
        raise FileNotFoundError(f"LoRA adapter {str(path)!r}: no lora_weights.safetensors / .ckpt found")
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(p))
    else:
        ckpt = torch.load(str(p), map_location="cpu", weights_only=True)
        state = ckpt.get("state_dict", ckpt)
    alpha = None
    cfg = d / "lora_config.json"
    if cfg.is_file():
        c = json.loads(cfg.read_text())
        c = c.get("lora_config", c)
        if "alpha" in c or "lora_alpha" in c:
            alpha = float(c.get("alpha", c.get("lora_alpha")))
    return {k.replace("._orig_mod.", "."): v for k, v in state.items()}, alpha


@torch.no_grad()
def fold_lora(model: nn.Module, adapter: dict[str, torch.Tensor], *, alpha: float = DEFAULT_ALPHA) -> list[str]:
    """``W += (alpha / r) B A`` for every adapted linear (in float32, then the weight's dtype);
    returns the adapted module paths."""
    if alpha <= 0:
        raise ValueError(f"LoRA alpha must be positive, got {alpha}")
    modules = dict(model.named_modules())
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in adapter.items():
        base, _, part = key.rpartition(".")
        if part not in ("lora_A", "lora_B"):
            raise ValueError(f"LoRA adapter key {key!r} is neither a lora_A nor a lora_B")
        pairs.setdefault(base, {})[part] = t
    done = []
    for base, pair in sorted(pairs.items()):
        if set(pair) != {"lora_A", "lora_B"}:
            raise ValueError(f"LoRA adapter: {base!r} has only {sorted(pair)}")
        lin = modules.get(base)
        if not isinstance(lin, nn.Linear):
            raise ValueError(f"LoRA adapter: {base!r} is not a linear layer of the model")
        a, b = pair["lora_A"].float(), pair["lora_B"].float()
        r = a.shape[0]
        if a.shape != (r, lin.in_features) or b.shape != (lin.out_features, r):
            raise ValueError(f"LoRA adapter: {base!r} has A {tuple(a.shape)} and B {tuple(b.shape)}, the layer is "
                             f"{lin.in_features} -> {lin.out_features}")
        w = lin.weight
        delta = (b.to(w.device) @ a.to(w.device)) * (alpha / r)
        w.copy_((w.float() + delta).to(w.dtype))
        done.append(base)
    return done
