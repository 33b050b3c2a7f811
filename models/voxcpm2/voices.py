"""Cloned voices for VoxCPM2: reference audio read, resampled to the VAE encoder's rate (16 kHz)
and encoded once, in float32, into the prompt patches a sequence's prompt refers to.

A voice has up to two parts, as the reference's prompt cache does (``prompt.build_prompt``):

- reference patches (``ref``): the audio alone, in the ``[ref_start, patches, ref_end]`` block
  (the reference's ``reference_wav_path``), right-padded to whole patches;
- continuation patches (``prompt``) with the words spoken in them (``prompt_text``): the prompt
  text goes before each segment's text and the patches after ``audio_start``, so the model
  speaks on from them (the reference's ``prompt_wav_path`` + ``prompt_text``), left-padded. The
  first generated patch is conditioned on the last prompt patch and the streaming VAE is warmed
  with the last ``min(3, C)`` prompt patches, whose audio is cut (``context``).

A registered voice (``from_voice_ref``: a WAV file and maybe its transcript) is a reference voice
without a transcript and both parts from the same audio with one (the reference's
``ref_continuation`` mode).

Resampling (``resample``): a windowed-sinc polyphase filter (Hann window, 6 zero crossings,
cut-off at 0.99 of the lower Nyquist rate). The reference loads audio with librosa (soxr), whose
filter differs: a voice registered at 16 kHz encodes exactly as the reference's, one at another
rate to within that difference.
"""

from __future__ import annotations

import math
import wave
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from models.voxcpm2.prompt import CONTEXT_PATCHES

__all__ = ["ClonedVoice", "encode_voice", "read_wav", "resample"]


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


def read_wav(path: str) -> tuple[np.ndarray, int]:
    """A PCM WAV file (8/16/24/32-bit integer samples, any channel count) -> (mono float32 in
    [-1, 1], its rate). Raises ``ValueError`` for what it cannot read."""
    try:
        with wave.open(path, "rb") as w:
            rate, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
            raw = w.readframes(w.getnframes())
    except (OSError, EOFError, wave.Error) as e:
        raise ValueError(f"cannot read {path!r} as a PCM WAV file: {e}") from None
    if width == 1:
        x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        x = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    elif width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        x = (np.where(v >= 1 << 23, v - (1 << 24), v)).astype(np.float32) / float(1 << 23)
    elif width == 4:
        x = np.frombuffer(raw, "<i4").astype(np.float32) / float(1 << 31)
    else:
        raise ValueError(f"{path!r}: {8 * width}-bit samples are not supported")
    return x.reshape(-1, channels).mean(axis=1).astype(np.float32), rate


def resample(wav: Tensor, orig_hz: int, new_hz: int, *, zero_crossings: int = 6, rolloff: float = 0.99) -> Tensor:
    """wav [S] float32 at ``orig_hz`` -> [ceil(S * new / orig)] at ``new_hz`` (see the module docstring)."""
    if orig_hz <= 0 or new_hz <= 0:
        raise ValueError(f"sample rates must be positive, got {orig_hz} and {new_hz}")
    g = math.gcd(orig_hz, new_hz)
    up, down = new_hz // g, orig_hz // g  # output phases, input samples per output period
    if up == down:
        return wav
    cutoff = min(up, down) * rolloff  # in units where the input rate is ``down``
    width = math.ceil(zero_crossings * down / cutoff)  # filter half-length in input samples
    taps = torch.arange(-width, width + down, dtype=torch.float64) / down  # [K]
    t = (-torch.arange(up, dtype=torch.float64)[:, None] / up + taps[None]) * cutoff  # [up, K]
    t = t.clamp(-zero_crossings, zero_crossings)
    window = torch.cos(t * math.pi / (2 * zero_crossings)) ** 2
    arg = t * math.pi
    sinc = torch.where(arg == 0, torch.ones_like(arg), torch.sin(arg) / torch.where(arg == 0, 1.0, arg))
    kernels = (sinc * window * (cutoff / down)).to(torch.float32)  # [up, K]
    x = torch.nn.functional.pad(wav.float()[None, None], (width, width + down))
    y = torch.nn.functional.conv1d(x, kernels[:, None], stride=down)  # [1, up, frames]
    out = y[0].T.reshape(-1)
    return out[: math.ceil(up * wav.shape[-1] / down)]


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
        x = resample(x, sample_rate, enc_rate).to(vae.encoder.fc_mu.weight.device)
        return vae.encode_patches(x, patch_size, left_pad=left).to(device)

    return ClonedVoice(name=name, ref=None if ref_wav is None else patches(ref_wav, False),
                       prompt=None if prompt_wav is None else patches(prompt_wav, True),
                       prompt_text=prompt_text or "")
