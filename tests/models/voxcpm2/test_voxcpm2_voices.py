"""Cloned VoxCPM2 voices: resampling to the encoder's 16 kHz (soxr), a registered voice of the
voice store prepared once (``prepare_voice``), refusals naming what is wrong."""

from __future__ import annotations

import hashlib
import wave
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from tests.models.voxcpm2.voxcpm2_serving import backend, run

from engine.backend import OptionError
from engine.voice_audio import read_voice


def _tone(rate: int, seconds: float) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 3000 * t)).astype(np.float32)


def _write(path: Path, wav: np.ndarray, rate: int) -> Path:
    """A 16-bit mono PCM WAV file, as the voice store keeps them."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.round(wav * 32767).astype("<i2").tobytes())
    return path


def _ref(path: Path, rate: int, transcript: str | None = None, voice_id: str = "v1") -> Any:
    return SimpleNamespace(voice_id=voice_id, path=str(path), sample_rate=rate,
                           sha256=hashlib.sha256(path.read_bytes()).hexdigest(), transcript=transcript)


@pytest.fixture(scope="module")
def tiny() -> Any:
    return backend(max_num_seqs=2, max_voice_patches=12)


@pytest.mark.parametrize("orig", [48000, 24000, 22050])
def test_audio_at_another_rate_is_resampled_by_soxr(tiny, orig: int) -> None:
    """A voice at another rate than the encoder's 16 kHz encodes as soxr's (default quality, as
    the reference's librosa.load) resampling of it does; at 16 kHz it is encoded as it is."""
    import soxr

    program = tiny.program
    x = _tone(orig, 0.4)
    got = program.add_voice(f"r{orig}", sample_rate=orig, ref_wav=x).ref
    with torch.no_grad():
        want = program.vae.encode_patches(torch.from_numpy(soxr.resample(x, orig, 16000).astype(np.float32)), 4)
    assert torch.equal(got, want)
    y = _tone(16000, 0.4)
    with torch.no_grad():
        assert torch.equal(program.add_voice("r16k", sample_rate=16000, ref_wav=y).ref,
                           program.vae.encode_patches(torch.from_numpy(y), 4))


def test_a_registered_voice_is_prepared_once(tiny, tmp_path: Path) -> None:
    """prepare_voice encodes the voice store's WAV once (again only when its sha256 changes) and
    returns its name, which validate then accepts; at 16 kHz it equals the encoder's own patches
    of the file's samples; a transcript adds the continuation part."""
    program = tiny.program
    path = _write(tmp_path / "v.wav", _tone(16000, 0.5), 16000)
    assert program.prepare_voice(_ref(path, 16000)) == "v1"
    first = program.voices["v1"]
    assert program.prepare_voice(_ref(path, 16000)) == "v1" and program.voices["v1"] is first
    with torch.no_grad():
        want = program.vae.encode_patches(torch.from_numpy(read_voice(_ref(path, 16000), 16000)), 4)
    assert first.prompt is None and torch.equal(first.ref, want)
    assert tiny.validate("v1", {})[0] == "v1"
    path2 = _write(tmp_path / "w.wav", _tone(24000, 0.4), 24000)
    assert program.prepare_voice(_ref(path2, 24000, transcript="Some words.", voice_id="v2")) == "v2"
    v2 = program.voices["v2"]
    assert v2.num_ref == v2.num_prompt > 0 and v2.prompt_text == "Some words."


def test_a_registered_voice_is_spoken(tiny, tmp_path: Path) -> None:
    """A prepared voice serves like any other: its patches differ from the zero-shot voice's."""
    path = _write(tmp_path / "s.wav", _tone(16000, 0.5), 16000)
    name = tiny.program.prepare_voice(_ref(path, 16000, voice_id="spoken"))
    opts = {"max_tokens": 5, "min_len": 4, "inference_timesteps": 2, "seed": 1}
    cloned, wav = run(tiny, "Hello there.", opts, voice=name)
    plain, _ = run(tiny, "Hello there.", opts)
    assert wav.size == 5 * 7680 and not torch.allclose(cloned, plain)


def test_unusable_voices_are_refused_naming_why(tiny, tmp_path: Path) -> None:
    """A missing or non-WAV file, a rate or sha256 that is not its record's, audio longer than a
    slot holds: each a voice_unavailable naming why (``engine.voice_audio`` reads the file)."""
    program = tiny.program
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not a wav")
    changed = _ref(_write(tmp_path / "c.wav", _tone(16000, 0.2), 16000), 16000, voice_id="changed")
    _write(tmp_path / "c.wav", _tone(16000, 0.3), 16000)
    cases = [(_ref(bad, 16000), "cannot be read"),
             (SimpleNamespace(voice_id="gone", path=str(tmp_path / "gone.wav"), sample_rate=16000,
                              sha256="0" * 64, transcript=None), "cannot be read"),
             (_ref(_write(tmp_path / "r.wav", _tone(16000, 0.2), 16000), 24000), "does not match"),
             (changed, "does not match"),
             (_ref(_write(tmp_path / "long.wav", _tone(16000, 3.0), 16000), 16000), "a slot holds 12")]
    for ref, why in cases:
        with pytest.raises(OptionError) as e:
            program.prepare_voice(ref)
        assert e.value.code == "voice_unavailable" and why in str(e.value)


def test_the_longest_voice_the_store_takes_fits_a_slot_with_its_transcript(tmp_path: Path) -> None:
    """At the default max_voice_patches, a voice of the voice store's longest (its default
    max_voice_duration_s) with a transcript (reference and continuation parts: twice its patches)
    is prepared, not refused when a stream names it."""
    from gateway.config import GatewayConfig

    seconds = GatewayConfig().max_voice_duration_s
    b = backend(max_num_seqs=1)
    path = _write(tmp_path / "long.wav", _tone(16000, seconds), 16000)
    assert b.program.prepare_voice(_ref(path, 16000, transcript="Words.")) == "v1"
    voice = b.program.voices["v1"]
    assert voice.num_ref == voice.num_prompt == -(-int(16000 * seconds) // 2560)


def test_a_voice_dropped_from_the_cache_fails_its_next_segment(tmp_path: Path) -> None:
    """Past max_cached_voices the oldest voice is dropped: a segment that still names it fails
    with a retryable voice_unavailable (never spoken zero-shot instead); the newer voice serves."""
    b = backend(max_num_seqs=1)
    b.program.max_cached_voices = 1
    wav = _tone(16000, 0.3)
    b.program.add_voice("old", sample_rate=16000, ref_wav=wav)
    voice, opts = b.validate("old", {"max_tokens": 2, "min_len": 1, "inference_timesteps": 1})
    b.program.add_voice("new", sample_rate=16000, ref_wav=wav)
    b.add_job(1, "Hello.", voice, opts)
    out = b.step()
    assert [(o.job_id, o.error.code, o.error.retryable) for o in out] == [(1, "voice_unavailable", True)]
    assert sorted(b.program.voices) == ["new"]
