"""Runs the reference package moshi 0.2.13 (in its own venv) for the Mimi parity tests.

    python reference_run.py build OUT.safetensors SPEC.json   # a tiny random Mimi, moshi's layout
    python reference_run.py run CKPT.safetensors JOBS.json OUT.pt

``build`` makes moshi's own ``MimiModel`` from ``SPEC["mimi_config"]`` (``loaders.get_mimi``),
gives it weights that make the comparisons meaningful (PyTorch's own init for convolutions,
linears and norms; random codebooks and usages; layer scales near 0.5, not moshi's 0.01, so the
transformers shape the output) and saves its ``state_dict`` with safetensors. ``run`` loads it
back with ``loaders.get_mimi`` and writes what the jobs ask for: whole-sequence decodes,
``mimi.streaming()`` frame-by-frame decodes, encodes. Nothing here is imported by the project.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def randomize_mimi(mimi: torch.nn.Module, seed: int) -> None:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in mimi.modules():
            if isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d, torch.nn.Linear, torch.nn.LayerNorm)):
                m.reset_parameters()
        for name, b in mimi.named_buffers():
            if name.endswith("embedding_sum"):
                b.copy_(torch.randn(b.shape, generator=gen))
            elif name.endswith("cluster_usage"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))
        for name, p in mimi.named_parameters():
            if name.endswith(".scale"):
                p.copy_(0.5 + 0.1 * torch.randn(p.shape, generator=gen))
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif "norm" in name and name.endswith("bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))


def build_mimi(mimi_config: dict, seed: int):
    from moshi.models import loaders

    mimi = loaders.get_mimi(None, mimi_config, num_codebooks=mimi_config["quantizer"]["n_q"])
    randomize_mimi(mimi, seed)
    return mimi


def save_mimi(mimi, out: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in mimi.state_dict().items()}, str(out))


def run(ckpt: Path, jobs: dict, out: Path) -> None:
    from moshi.models import loaders

    torch.set_num_threads(1)
    results: dict = {}
    for key, job in jobs.items():
        mimi = loaders.get_mimi(ckpt, job["mimi_config"], num_codebooks=job.get("num_codebooks", 32))
        res: dict = {}
        with torch.no_grad():
            if "codes" in job:
                codes = torch.tensor(job["codes"], dtype=torch.long)  # [B, K, T]
                res["whole"] = mimi.decode(codes)
                with mimi.streaming(codes.shape[0]):
                    res["stream"] = torch.cat([mimi.decode(codes[:, :, t:t + 1]) for t in range(codes.shape[-1])], -1)
            if "wav" in job:
                wav = torch.tensor(job["wav"], dtype=torch.float32)  # [B, 1, S]
                res["codes"] = mimi.encode(wav)
        results[key] = res
    torch.save(results, out)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "build":
        spec = json.loads(Path(sys.argv[3]).read_text())
        save_mimi(build_mimi(spec["mimi_config"], spec.get("seed", 0)), Path(sys.argv[2]))
    elif cmd == "run":
        run(Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text()), Path(sys.argv[4]))
    else:
        raise SystemExit(f"usage: {sys.argv[0]} build|run ...")
