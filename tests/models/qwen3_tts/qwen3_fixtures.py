"""Helpers for the Qwen3-TTS parity tests: the reference venv, the tiny checkpoints' spec, the
reference jobs and a greedy generation loop over our modules (a uniquely named module)."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import torch

from models.qwen3_tts.config import TINY, TINY_BASE

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
REF_VENV = Path(os.environ.get("VOXGATE_QWEN_TTS_REF_VENV", ROOT / ".venvs" / "qwen-tts-ref"))
REF_PYTHON = REF_VENV / "bin" / "python"
REF_SCRIPT = HERE / "reference_run.py"

# A small Mimi encoder for the speech tokenizer (the decoder parity never runs it; the reference
# builds it when loading, so it only has to be cheap): 12.5 Hz at 24 kHz like the real one.
MIMI_ENCODER = {
    "hidden_size": 32, "num_filters": 4, "num_hidden_layers": 1, "intermediate_size": 64,
    "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "codebook_dim": 16,
    "vector_quantization_hidden_dimension": 16, "num_quantizers": 16, "codebook_size": 2048,
    "sliding_window": 250, "upsample_groups": 4,
}


def spec() -> dict:
    """What ``reference_run.py build`` writes: our TINY presets in the checkpoint layout."""
    st = TINY.codec.to_hf_dict()
    st["encoder_config"] = MIMI_ENCODER
    return {"seed": 0, "speech_tokenizer": st,
            "checkpoints": {"custom": TINY.to_hf_dict(), "base": TINY_BASE.to_hf_dict()}}


def ref_wav(seconds: float, seed: int) -> list[float]:
    """A deterministic test signal at 24 kHz: two tones plus noise, amplitude below 0.5."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(int(24000 * seconds)) / 24000
    x = 0.2 * torch.sin(2 * math.pi * 220 * t) + 0.1 * torch.sin(2 * math.pi * 1375 * t)
    return (x + 0.05 * torch.randn(t.shape, generator=g)).tolist()


def codec_codes(frames: int, seed: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2048, (frames, 16), generator=g).tolist()


GEN_JOBS = {
    "cv_dual": dict(checkpoint="custom", mode="custom", text="Hello world, it's 2026!", speaker="Ryan",
                    language="English", non_streaming=False, max_new_tokens=12),
    "cv_nonstream_dialect": dict(checkpoint="custom", mode="custom", text="Don't stop: 3.14 café.",
                                 speaker="dylan", language="Auto", non_streaming=True, max_new_tokens=10),
    "cv_instruct": dict(checkpoint="custom", mode="custom", text="你好世界, hello", speaker="vivian",
                        language="Chinese", instruct="Speak warmly and slowly.", non_streaming=False,
                        max_new_tokens=10),
    "cv_stop": dict(checkpoint="custom", mode="custom", text="The quick brown fox.", speaker="aiden",
                    language="English", non_streaming=False, max_new_tokens=40, eos_scale=1000.0),
    "clone_dual": dict(checkpoint="base", mode="clone", text="Really? Yes, really.", language="English",
                       non_streaming=False, max_new_tokens=10, ref_wav=ref_wav(1.3, 1)),
}
JOBS = {
    **{k: {"kind": "generate", **v} for k, v in GEN_JOBS.items()},
    "codec": {"kind": "codec", "checkpoint": "custom", "codes": codec_codes(30), "prefix": 17},
    "xvector": {"kind": "xvector", "checkpoint": "base", "wav": ref_wav(2.0, 2)},
    "mrope": {"kind": "mrope", "checkpoint": "custom", "positions": [0, 1, 2, 5, 17, 40, 333]},
}


def run_reference(args: list[str], timeout_s: float) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([str(REF_PYTHON), str(REF_SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout_s, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"reference run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


def build_checkpoints(out: Path) -> Path:
    spec_file = out / "spec.json"
    spec_file.write_text(json.dumps(spec()))
    run_reference(["build", str(out), str(spec_file)], timeout_s=600)
    return out


def reference_outputs(root: Path, work: Path) -> dict:
    jobs_file, out = work / "jobs.json", work / "ref_out.pt"
    jobs_file.write_text(json.dumps(JOBS))
    run_reference(["run", str(root), str(jobs_file), str(out)], timeout_s=900)
    return torch.load(out)
