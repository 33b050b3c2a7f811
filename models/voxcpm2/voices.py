"""Cloned voices for VoxCPM2: reference audio read, resampled to 16 kHz and encoded once, in
float32, into the prompt patches a sequence's prompt refers to (docs/models/voxcpm2.md,
"Voices" and "Prompts and voices").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from models.voxcpm2.prompt import CONTEXT_PATCHES

__all__ = ["ClonedVoice", "encode_voice"]


@dataclass(frozen=True)
class ClonedVoice:
    """A voice's prompt patches (float32, on the model's device) and its transcript."""

    name: str
    ref: Tensor | None = None  # [R, P, D] reference patches
    prompt: Tensor | None = None  # [C, P, D] continuation patches
    prompt_text: str = ""

    @property
    def num_ref(self) -> int:
        return 0 if self.ref is None else int(self.ref.shape[0])

    @property
    def num_prompt(self) -> int:
        return 0 if self.prompt is None else int(self.prompt.shape[0])

    @property
    def num_patches(self) -> int:
        return self.num_ref + self.num_prompt

    def patches(self) -> Tensor | None:
        """Every prompt patch in the order the prompt's ids index them: reference, then continuation."""
        parts = [p for p in (self.ref, self.prompt) if p is not None]
        return torch.cat(parts) if parts else None

    @property
    def cond(self) -> Tensor | None:
        """The first generated patch's condition: the last continuation patch (None: zeros)."""
        return None if self.prompt is None else self.prompt[-1]

    @property
    def context(self) -> Tensor | None:
        """The patches that warm the streaming VAE (their audio is cut), [K, P, D] or None."""
        return None if self.prompt is None else self.prompt[-CONTEXT_PATCHES:]


@torch.no_grad()
def encode_voice(vae: Any, patch_size: int, name: str, *, device: torch.device | str, sample_rate: int,
                 ref_wav: np.ndarray | Tensor | None = None, prompt_wav: np.ndarray | Tensor | None = None,
                 prompt_text: str | None = None) -> ClonedVoice:
    """Encode a voice's audio (mono, at ``sample_rate``) with the float32 VAE encoder."""
    if (prompt_wav is None) != (prompt_text is None):
        raise ValueError("a continuation voice needs both its audio and its transcript")
    if ref_wav is None and prompt_wav is None:
        raise ValueError("a voice needs reference audio")
    enc_rate = vae.config.sample_rate

    def patches(wav: np.ndarray | Tensor, left: bool) -> Tensor:
        x = torch.as_tensor(np.asarray(wav, dtype=np.float32)).reshape(-1)
        if x.numel() == 0 or not bool(torch.isfinite(x).all()):
            raise ValueError("voice audio must be non-empty and finite")
        if sample_rate != enc_rate:
            import soxr

            x = torch.from_numpy(soxr.resample(x.numpy(), sample_rate, enc_rate).astype(np.float32, copy=False))
        x = x.to(vae.encoder.fc_mu.weight.device)
        return vae.encode_patches(x, patch_size, left_pad=left).to(device)

    return ClonedVoice(name=name, ref=None if ref_wav is None else patches(ref_wav, False),
                       prompt=None if prompt_wav is None else patches(prompt_wav, True),
                       prompt_text=prompt_text or "")
