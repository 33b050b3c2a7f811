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


def load_ours(root: Path, name: str):
    from models.qwen3_tts.loader import load_qwen3_tts

    return load_qwen3_tts(root / name, dtype=torch.float32)


def our_prompt(loaded, job: dict, xvector: torch.Tensor | None = None):
    """(Prompt, embeds [P, H]) for a generation job, built by our prompt code."""
    from models.qwen3_tts.prompt import build_prompt

    tok, cfg, talker = loaded.tokenizer, loaded.config, loaded.model.talker
    clone = job["mode"] == "clone"
    p = build_prompt(cfg, tok.text_ids(job["text"]), role_ids=tok.role_ids, language=job["language"],
                     speaker=None if clone else job["speaker"], xvector=clone,
                     instruct_ids=tok.instruct_ids(job["instruct"]) if job.get("instruct") else None,
                     dual_track=not job["non_streaming"])
    packed = torch.tensor(p.packed, dtype=torch.int64)
    xv = None
    if clone:
        xv = torch.zeros(len(p.packed), cfg.talker.hidden_size)
        xv[p.xvector_rows] = xvector
    with torch.no_grad():
        return p, talker.embed_prompt(packed, xv)


def text_track_id(prompt, config, k: int) -> int:
    """The text-track id of decode row k (0 = the first frame's feedback)."""
    if k < len(prompt.text_track):
        return prompt.text_track[k]
    if k == len(prompt.text_track) and prompt.eos_pending:
        return config.tts_eos_token_id
    return config.tts_pad_token_id


def greedy_generate(loaded, prompt, embeds: torch.Tensor, max_frames: int, *, repetition_penalty: float = 1.05,
                    eos_scale: float | None = None) -> torch.Tensor:
    """Our own loop over our modules, greedy: codes [frames, 16] up to (not including) eos."""
    from tests.models.orpheus.dense_attention import DenseAttention

    from models.qwen3_tts.code_predictor import MIN_FRAMES_BEFORE_EOS, code0_mask, decode_frame

    talker, cfg = loaded.model.talker, loaded.config
    eos = cfg.talker.codec_eos_token_id
    head = talker.codec_head.weight
    saved = head[eos].clone()
    if eos_scale:
        head.data[eos] *= eos_scale
    seen: list[int] = []

    def sample(logits: torch.Tensor, salt: int) -> torch.Tensor:
        if salt == 0 and seen and repetition_penalty != 1.0:  # HF's penalty over generated code-0 ids
            idx = torch.tensor(sorted(set(seen)))
            col = logits[:, idx]
            logits = logits.clone()
            logits[:, idx] = torch.where(col < 0, col * repetition_penalty, col / repetition_penalty)
        return logits.argmax(-1)

    allowed = code0_mask(cfg.talker)
    attn = DenseAttention(cfg.talker.num_hidden_layers)
    frames = []
    try:
        with torch.no_grad():
            n = embeds.shape[0]
            h = talker(embeds, torch.arange(n), attn)[-1:]
            for k in range(max_frames):
                codes = decode_frame(talker, h, sample, allowed=allowed,
                                     eos_ok=torch.tensor([k >= MIN_FRAMES_BEFORE_EOS]))
                seen.append(int(codes[0, 0]))
                if int(codes[0, 0]) == eos:
                    break
                frames.append(codes[0])
                x = talker.embed_decode(torch.tensor([text_track_id(prompt, cfg, k)]), codes)
                h = talker(x, torch.tensor([n + k]), attn)
    finally:
        head.data[eos] = saved
    return torch.stack(frames) if frames else torch.zeros(0, 16, dtype=torch.int64)
