"""Helpers for the VoxCPM2 parity tests: the reference venv, the tiny checkpoint's spec, the
reference jobs and a generation loop over our modules (a uniquely named module)."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import torch

from models.voxcpm2.config import TINY

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
REF_VENV = Path(os.environ.get("VOXGATE_VOXCPM_REF_VENV", ROOT / ".venvs" / "voxcpm-ref"))
REF_PYTHON = REF_VENV / "bin" / "python"
REF_SCRIPT = HERE / "reference_run.py"

# The adapter: rank 4, alpha 8 (scaling 2) on the LMs, the DiT and the projections.
LORA = {"enable_lm": True, "enable_dit": True, "enable_proj": True, "r": 4, "alpha": 8}


def spec() -> dict:
    cfg = TINY.to_hf_dict()
    cfg["device"] = "cpu"
    return {"seed": 0, "config": cfg, "lora": LORA}


def wav16k(seconds: float, seed: int) -> list[float]:
    """A deterministic test signal at 16 kHz: two tones plus noise, amplitude below 0.5."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(int(16000 * seconds)) / 16000
    x = 0.2 * torch.sin(2 * math.pi * 220 * t) + 0.1 * torch.sin(2 * math.pi * 1375 * t)
    return (x + 0.05 * torch.randn(t.shape, generator=g)).tolist()


TEXTS = ["Hello world, 你好世界!", "The quick brown fox.", "中国很美 and 世界", "  spaces   and\ttabs ", "It's 2026!"]

GEN_JOBS = {
    "zero_shot": dict(text="Hello world, 你好世界!", min_len=2, max_len=9, timesteps=10, cfg=2.0, seed=1),
    "zero_shot_settings": dict(text="The quick brown fox.", min_len=1, max_len=7, timesteps=5, cfg=1.5, seed=2),
    "clone": dict(text="Really? Yes, really.", min_len=2, max_len=8, timesteps=10, cfg=2.0, seed=3,
                  ref_wav=wav16k(0.9, 1)),
    "continuation": dict(text="Don't stop.", min_len=2, max_len=8, timesteps=10, cfg=2.0, seed=4,
                         prompt_wav=wav16k(0.7, 2), prompt_text="Hello world."),
    "lora": dict(text="Hello world, 你好世界!", min_len=2, max_len=8, timesteps=10, cfg=2.0, seed=5, lora=LORA),
}


def vae_latents(frames: int = 24, seed: int = 7) -> list[list[float]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(TINY.feat_dim, frames, generator=g).tolist()


JOBS = {
    **{k: {"kind": "generate", **v} for k, v in GEN_JOBS.items()},
    "tokenize": {"kind": "tokenize", "texts": TEXTS},
    "vae": {"kind": "vae", "latents": vae_latents(), "wav": wav16k(0.5, 3)},
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


def load_ours(root: Path, *, lora: bool = False):
    from models.voxcpm2.loader import load_voxcpm2

    return load_voxcpm2(root / "base", dtype=torch.float32, lora=root / "lora" if lora else None,
                        lora_alpha=LORA["alpha"] if lora else None)


def row_inputs(seeds: list[int], steps: list[int], rows: list[int], keep: list[bool] | None = None):
    from engine.llm.token_head import RowInputs

    n = len(seeds)
    return RowInputs(temperature=torch.ones(n), top_p=torch.ones(n), repetition_penalty=torch.ones(n),
                     seeds=torch.tensor(seeds), steps=torch.tensor(steps), rows=torch.tensor(rows),
                     allowed_rows=torch.zeros(n, dtype=torch.int64),
                     keep=torch.tensor(keep if keep is not None else [True] * n))


def injected(noise: torch.Tensor):
    """A NoiseFn that returns the reference's recorded noise [N, D, P] by patch index."""
    def fn(seeds: torch.Tensor, steps: torch.Tensor, feat_dim: int, patch_size: int) -> torch.Tensor:
        return noise[steps]
    return fn


def our_patches(loaded, job: dict) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(reference patches, continuation patches) of a job, encoded by our VAE encoder."""
    vae, p = loaded.vae, loaded.config.patch_size
    with torch.no_grad():
        ref = vae.encode_patches(torch.tensor(job["ref_wav"]), p) if job.get("ref_wav") else None
        cont = vae.encode_patches(torch.tensor(job["prompt_wav"]), p, left_pad=True) if job.get("prompt_wav") else None
    return ref, cont


def our_prompt(loaded, job: dict):
    """(Prompt, prompt patches [N, P, D] or None, first condition or None) for a job, all ours."""
    from models.voxcpm2.prompt import build_prompt

    ref, cont = our_patches(loaded, job)
    text_ids = loaded.tokenizer.ids(job.get("prompt_text", "") + job["text"])
    p = build_prompt(text_ids, ref_patches=0 if ref is None else len(ref),
                     prompt_patches=0 if cont is None else len(cont))
    parts = [x for x in (ref, cont) if x is not None]
    return p, (torch.cat(parts) if parts else None), (None if cont is None else cont[-1])


def generate(loaded, prompt, feats: torch.Tensor | None, *, noise, seed: int, timesteps: int, cfg: float,
             min_len: int, max_len: int, cond: torch.Tensor | None = None) -> torch.Tensor:
    """Our loop over our modules (one sequence, eager): latents [T, P, D]."""
    from tests.models.orpheus.dense_attention import DenseAttention

    from models.voxcpm2.head import PatchHead
    from models.voxcpm2.model import LAST_PATCH, STOP, SlotFeatures

    model, c = loaded.model, loaded.config
    n_feats = 0 if feats is None else len(feats)
    slots = SlotFeatures(1, max(n_feats, 1), c.patch_size, c.feat_dim, device="cpu")
    if feats is not None:
        slots.prompt[0, :n_feats] = feats
    model.slot_feats = slots
    head = PatchHead(model, slots, max_num_seqs=1, max_steps=10, ring_patches=max_len, noise=noise)
    head.configure(0, steps=timesteps, cfg=cfg, min_len=min_len, cond=cond)
    attn = DenseAttention(model.num_layers)
    ids = torch.tensor(prompt.ids)
    n = len(ids)
    out = []
    with torch.no_grad():
        h = model(ids, torch.arange(n), attn, torch.zeros(n, dtype=torch.int64))[-1:]
        for i in range(max_len):
            tok, _ = head.sample(h, row_inputs([seed], [i], [0]))
            out.append(slots.last[0].clone())
            if int(tok[0, 0]) == STOP:
                break
            h = model(torch.tensor([LAST_PATCH]), torch.tensor([n + i]), attn, torch.zeros(1, dtype=torch.int64))
    return torch.stack(out)


def to_vae(latents: torch.Tensor) -> torch.Tensor:
    """patches [T, P, D] -> VAE latents [1, D, T * P]."""
    return latents.reshape(-1, latents.shape[-1]).T[None]
