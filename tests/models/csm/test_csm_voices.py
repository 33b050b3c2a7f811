"""CSM's context audio: the frame pool, the voice cache (reuse, eviction, voices in use kept),
WAV reading and resampling."""

from __future__ import annotations

import gc
import wave

import numpy as np
import pytest
import torch

from models.csm.voices import FramePool, PoolFull, VoiceCache, read_wav, resample


def _codes(n: int, value: int) -> torch.Tensor:
    return torch.full((n, 4), value, dtype=torch.int64)


class _Holder:
    pass


def test_the_pool_hands_out_rows_above_the_zero_frame() -> None:
    """Row 0 stays the all-zero frame; rows are stored and given back; too many is PoolFull."""
    pool = FramePool(6, 4, "cpu")
    rows = pool.allocate(_codes(3, 7))
    assert 0 not in rows and pool.num_free == 2
    assert (pool.table[list(rows)] == 7).all() and (pool.table[0] == 0).all()
    with pytest.raises(PoolFull):
        pool.allocate(_codes(3, 1))
    pool.free(rows)
    assert pool.num_free == 5


def test_unused_voices_are_evicted_least_recently_used_first_and_used_ones_kept() -> None:
    """A full pool evicts voices nobody holds, oldest use first; a held voice is never evicted
    (PoolFull instead), and is freed once its holder is gone."""
    cache = VoiceCache(FramePool(7, 4, "cpu"))  # 6 free rows
    a = cache.add("a", "sa", "text a", _codes(2, 1))
    cache.add("b", "sb", "text b", _codes(2, 2))
    cache.add("c", "sc", "text c", _codes(2, 3))
    assert cache.fresh("a", "sa") is a  # a is now the most recently used
    cache.add("d", "sd", "text d", _codes(2, 4))
    assert cache.get("b") is None and cache.get("a") is a
    holder = _Holder()
    for name in ("a", "c", "d"):
        cache.hold(cache.get(name), holder)
    with pytest.raises(PoolFull):
        cache.add("e", "se", "text e", _codes(2, 5))
    del holder
    gc.collect()
    assert cache.add("e", "se", "text e", _codes(2, 5)).num_frames == 2


def test_a_voice_replaced_while_in_use_keeps_its_frames_until_released() -> None:
    """A voice encoded again (new sha256) while a stream holds the old one: the old rows stay
    valid for that stream and return to the pool once it lets go."""
    cache = VoiceCache(FramePool(5, 4, "cpu"))
    old = cache.add("a", "s1", "t", _codes(2, 1))
    holder = _Holder()
    cache.hold(old, holder)
    new = cache.add("a", "s2", "t", _codes(2, 2))
    assert cache.fresh("a", "s1") is None and cache.fresh("a", "s2") is new
    assert (cache.pool.table[list(old.rows)] == 1).all() and cache.pool.num_free == 0
    cache.release(holder)
    assert cache.pool.num_free == 2


def test_read_wav_gives_float_mono_samples(tmp_path) -> None:
    """16-bit stereo PCM reads as float32 in [-1, 1], channels averaged, with its rate."""
    path = tmp_path / "s.wav"
    pcm = np.array([[16384, -16384], [32767, 32767]], dtype="<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.tobytes())
    x, rate = read_wav(str(path))
    assert rate == 16000 and x.dtype == np.float32
    np.testing.assert_allclose(x, [0.0, 32767 / 32768], atol=1e-7)
    with pytest.raises(ValueError):
        read_wav(str(tmp_path / "missing.wav"))


def test_resampling_keeps_the_length_in_time_and_the_pitch() -> None:
    """A 440 Hz tone at 48 kHz resampled to 24 kHz: half the samples, the same peak frequency."""
    t = np.arange(48000) / 48000
    y = resample(np.sin(2 * np.pi * 440 * t).astype(np.float32), 48000, 24000)
    assert y.size == 24000
    spectrum = np.abs(np.fft.rfft(y))
    assert abs(np.argmax(spectrum) * 24000 / y.size - 440) < 2
