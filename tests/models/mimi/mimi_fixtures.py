"""Helpers for the Mimi parity tests: the moshi reference venv, the tiny checkpoint's spec, the
reference jobs (a uniquely named module)."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import torch

from models.mimi.config import TINY

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
# Built by tests/models/kyutai_tts/make_reference_venv.sh (moshi serves both test folders).
REF_VENV = Path(os.environ.get("VOXGATE_MOSHI_REF_VENV", ROOT / ".venvs" / "moshi-ref"))
REF_PYTHON = REF_VENV / "bin" / "python"
REF_SCRIPT = HERE / "reference_run.py"
FRAMES = 11  # crosses TINY's transformer window (6 steps = 3 frames) several times


def run_reference(script: Path, args: list[str], timeout_s: float) -> None:
    """Run a reference script in the moshi venv (offline); raise with its stderr on failure."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "NO_TORCH_COMPILE": "1"}
    proc = subprocess.run([str(REF_PYTHON), str(script), *args], capture_output=True, text=True,
                          timeout=timeout_s, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"reference run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


def sample_wav(seconds: float, seed: int, batch: int = 1) -> list:
    """A deterministic 24 kHz signal [B, 1, S]: tones plus noise, below 0.5 in amplitude."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(int(24000 * seconds)) / 24000
    rows = [0.2 * torch.sin(2 * math.pi * (180 + 90 * b) * t) + 0.1 * torch.sin(2 * math.pi * 1333 * t)
            + 0.05 * torch.randn(t.shape, generator=g) for b in range(batch)]
    return torch.stack(rows)[:, None].tolist()


def sample_codes(batch: int, k: int, frames: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2048, (batch, k, frames), generator=g).tolist()


def jobs() -> dict:
    cfg = TINY.to_dict()
    return {
        "decode32": {"mimi_config": cfg, "codes": sample_codes(2, 32, FRAMES, 1)},
        "decode8": {"mimi_config": cfg, "codes": sample_codes(1, 8, FRAMES, 2), "num_codebooks": 8},
        "encode32": {"mimi_config": cfg, "wav": sample_wav(0.9, 3, batch=2)},
        "encode12_ragged": {"mimi_config": cfg, "wav": sample_wav(0.5117, 4), "num_codebooks": 12},
    }


def build_checkpoint(out_dir: Path) -> Path:
    spec = out_dir / "spec.json"
    spec.write_text(json.dumps({"seed": 0, "mimi_config": TINY.to_dict()}))
    ckpt = out_dir / "mimi_tiny.safetensors"
    run_reference(REF_SCRIPT, ["build", str(ckpt), str(spec)], timeout_s=300)
    return ckpt


def reference_outputs(ckpt: Path, work: Path) -> dict:
    jobs_file, out = work / "jobs.json", work / "ref_out.pt"
    jobs_file.write_text(json.dumps(jobs()))
    run_reference(REF_SCRIPT, ["run", str(ckpt), str(jobs_file), str(out)], timeout_s=300)
    return torch.load(out)
