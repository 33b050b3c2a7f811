"""Helpers for the CSM parity tests: the reference venv, the tiny checkpoints' spec, the
reference jobs, voices as WAV files (a uniquely named module)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import wave
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from models.csm.config import TINY

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
REF_VENV = Path(os.environ.get("VOXGATE_CSM_REF_VENV", ROOT / ".venvs" / "csm-ref"))
REF_PYTHON = REF_VENV / "bin" / "python"
REF_SCRIPT = HERE / "reference_run.py"
STOP_SCALE = 2.0  # the "stop" checkpoint's lm_head row-0 scale: its texts end after 10 and 2 frames


def spec() -> dict:
    """What ``reference_run.py build`` writes: TINY in the checkpoint layout ("main", tied codebook
    tables) and a variant that stops soon ("stop", untied tables)."""
    return {"seed": 0, "checkpoints": {
        "main": {"config": TINY.to_hf_dict()},
        "stop": {"config": replace(TINY, tie_codebooks_embeddings=False).to_hf_dict(), "stop_scale": STOP_SCALE},
    }}


def voice_wav(seconds: float, seed: int) -> list[float]:
    """A deterministic 24 kHz signal on the 16-bit grid (what a WAV file holds): tones plus noise."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(int(24000 * seconds)) / 24000
    x = 0.2 * torch.sin(2 * math.pi * (180 + 40 * seed) * t) + 0.1 * torch.sin(2 * math.pi * 1375 * t)
    x = x + 0.05 * torch.randn(t.shape, generator=g)
    return (torch.round(x * 32768).clamp(-32768, 32767) / 32768).tolist()


def codec_codes(batch: int, frames: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2048, (batch, 32, frames), generator=g).tolist()


# The context voices: (transcript, seconds; 0.7 s and 0.45 s are not whole numbers of frames)
VOICES = {"v-a": ("I said this, a while ago.", 0.7, 1), "v-b": ("Then the other one answered.", 0.45, 2)}
GEN_JOBS = {
    "plain": dict(checkpoint="main", turns=[(0, "Hello there, friend.", None)], max_new_tokens=8),
    "context": dict(checkpoint="main", turns=[(0, VOICES["v-a"][0], "v-a"), (1, "And you said that?", None)],
                    max_new_tokens=8),
    "clone": dict(checkpoint="main", turns=[(0, VOICES["v-b"][0], "v-b"), (0, "Now say it like that.", None)],
                  max_new_tokens=6),
    "two_turns": dict(checkpoint="main", turns=[(1, VOICES["v-a"][0], "v-a"), (0, VOICES["v-b"][0], "v-b"),
                                                (1, "Final words.", None)], max_new_tokens=6),
    "stop_long": dict(checkpoint="stop", turns=[(0, "Hello there, friend.", None)], max_new_tokens=20),
    "stop_short": dict(checkpoint="stop", turns=[(0, "Don't stop: they'll say you've won.", None)], max_new_tokens=20),
}
CODEC_WAVS = {"whole": 3 * 1920, "ragged": int(24000 * 0.37), "long": int(24000 * 1.3)}


def jobs() -> dict:
    out: dict = {}
    wavs = {name: voice_wav(secs, seed) for name, (_, secs, seed) in VOICES.items()}
    for name, job in GEN_JOBS.items():
        turns = [{"speaker": s, "text": t, "wav": None if v is None else wavs[v]} for s, t, v in job["turns"]]
        out[name] = {"kind": "generate", "checkpoint": job["checkpoint"], "turns": turns,
                     "max_new_tokens": job["max_new_tokens"]}
    out["codec"] = {"kind": "codec", "checkpoint": "main", "codes": codec_codes(2, 12, 5),
                    "wavs": [voice_wav(n / 24000, 7 + i)[:n] for i, n in enumerate(CODEC_WAVS.values())]}
    return out


def run_reference(args: list[str], timeout_s: float) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([str(REF_PYTHON), str(REF_SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout_s, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"reference run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


def build_and_run(root: Path, work: Path) -> dict:
    """The tiny checkpoints written to ``root`` (``spec``), then every reference output of
    ``jobs`` from them: one reference process (importing transformers is most of its time)."""
    spec_file, jobs_file, out = work / "spec.json", work / "jobs.json", work / "ref_out.pt"
    spec_file.write_text(json.dumps(spec()))
    jobs_file.write_text(json.dumps(jobs()))
    run_reference(["build-run", str(root), str(spec_file), str(jobs_file), str(out)], timeout_s=900)
    return torch.load(out)


def write_voice(folder: Path, name: str):
    """VOICES[name] as a 16-bit WAV file and its ``engine.messages.VoiceRef``-like record."""
    from types import SimpleNamespace

    transcript, seconds, seed = VOICES[name]
    samples = np.round(np.asarray(voice_wav(seconds, seed)) * 32768).astype("<i2")
    path = folder / f"{name}.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes(samples.tobytes())
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return SimpleNamespace(voice_id=name, path=str(path), sample_rate=24000, sha256=sha, transcript=transcript)
