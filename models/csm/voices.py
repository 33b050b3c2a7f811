"""Context audio for CSM: registered voices encoded once by Mimi, their frames kept in a pool with
least-recently-used eviction (docs/models/csm.md, "Voices, speakers and context").
"""

from __future__ import annotations

import wave
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["ContextVoice", "FramePool", "PoolFull", "VoiceCache", "read_wav", "resample"]


class PoolFull(RuntimeError):
    """No free rows for a voice's frames (every cached voice is in use)."""


class FramePool:
    """``table`` int64 [rows, K] on the device; row 0 is all zeros and never handed out."""

    def __init__(self, rows: int, num_codebooks: int, device: torch.device | str) -> None:
        if rows < 2:
            raise ValueError(f"the context pool needs at least 2 rows, got {rows}")
        self.table = torch.zeros(rows, num_codebooks, dtype=torch.int64, device=device)
        self._free = list(range(rows - 1, 0, -1))  # a stack: low rows first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, codes: Tensor) -> tuple[int, ...]:
        """Store frames ``codes`` [N, K] (host or device) in N free rows; returns the rows."""
        n = int(codes.shape[0])
        if n > len(self._free):
            raise PoolFull(f"the context pool has {len(self._free)} free frames, {n} needed")
        rows = tuple(self._free.pop() for _ in range(n))
        if n:
            index = torch.tensor(rows, dtype=torch.int64).to(self.table.device, non_blocking=True)
            self.table.index_copy_(0, index, codes.to(self.table.device, torch.int64, non_blocking=True))
        return rows

    def free(self, rows: tuple[int, ...]) -> None:
        self._free.extend(reversed(rows))


@dataclass(eq=False)
class ContextVoice:
    """A registered voice: its frames' pool rows and the words spoken in it."""

    name: str
    sha256: str
    transcript: str
    rows: tuple[int, ...]
    holders: weakref.WeakSet = field(default_factory=weakref.WeakSet)

    @property
    def num_frames(self) -> int:
        return len(self.rows)


class VoiceCache:
    """Registered voices by name, their frames in ``pool`` (see the module docstring)."""

    def __init__(self, pool: FramePool) -> None:
        self.pool = pool
        self.voices: OrderedDict[str, ContextVoice] = OrderedDict()  # least recently used first
        self._retired: list[ContextVoice] = []  # replaced while in use: freed once unheld

    def get(self, name: str) -> ContextVoice | None:
        return self.voices.get(name)

    def fresh(self, name: str, sha256: str) -> ContextVoice | None:
        """The cached voice ``name`` if it was encoded from ``sha256`` (marked recently used)."""
        v = self.voices.get(name)
        if v is None or v.sha256 != sha256:
            return None
        self.voices.move_to_end(name)
        return v

    def add(self, name: str, sha256: str, transcript: str, codes: Tensor) -> ContextVoice:
        """Store a voice's frames [N, K]; evicts unused voices when the pool is short.
        Raises ``PoolFull`` when the voices in use leave too little room."""
        old = self.voices.pop(name, None)
        if old is not None:
            self._retired.append(old)
        self._sweep()
        need = int(codes.shape[0])
        for victim in [v for v in self.voices.values() if not v.holders]:
            if self.pool.num_free >= need:
                break
            del self.voices[victim.name]
            self.pool.free(victim.rows)
        voice = ContextVoice(name, sha256, transcript, self.pool.allocate(codes))
        self.voices[name] = voice
        return voice

    def hold(self, voice: ContextVoice, holder: Any) -> None:
        voice.holders.add(holder)

    def release(self, holder: Any) -> None:
        for v in (*self.voices.values(), *self._retired):
            v.holders.discard(holder)
        self._sweep()

    def _sweep(self) -> None:
        """Free the rows of replaced voices nobody holds any more."""
        for v in [v for v in self._retired if not v.holders]:
            self._retired.remove(v)
            self.pool.free(v.rows)


def read_wav(path: str) -> tuple[np.ndarray, int]:
    """A PCM WAV file -> (float32 mono samples in [-1, 1], sample rate); ``ValueError`` if it is
    not one (8/16/24/32-bit integer PCM; channels are averaged)."""
    try:
        with wave.open(path, "rb") as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            raw = w.readframes(w.getnframes())
    except (OSError, EOFError, wave.Error) as e:
        raise ValueError(f"cannot read the WAV file: {e}") from None
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
        raise ValueError(f"unsupported WAV sample width {width}")
    if channels > 1:
        x = x[: x.size - x.size % channels].reshape(-1, channels).mean(axis=1)
    return x.astype(np.float32), rate


def resample(x: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Band-limited resampling by the FFT (the spectrum cut or zero-padded): a short voice clip
    at any rate -> ``target`` Hz."""
    if rate == target or x.size == 0:
        return x.astype(np.float32)
    n = max(1, int(round(x.size * target / rate)))
    spec = np.fft.rfft(x.astype(np.float64))
    out = np.zeros(n // 2 + 1, dtype=np.complex128)
    m = min(out.size, spec.size)
    out[:m] = spec[:m]
    return (np.fft.irfft(out, n) * (n / x.size)).astype(np.float32)
