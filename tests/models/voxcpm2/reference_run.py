"""Runs the reference package voxcpm 2.0.3 (in its own venv) for the VoxCPM2 parity tests.

    python reference_run.py build OUT_DIR SPEC.json   # tiny checkpoints in the released layout
    python reference_run.py run CKPT_DIR JOBS.json OUT.pt

``build`` writes ``OUT_DIR/base`` (config.json, model.safetensors, audiovae.safetensors with
its weight-norm ``weight_g`` / ``weight_v``, tokenizer.json + tokenizer_config.json) from the
reference's own modules with random weights, and ``OUT_DIR/lora`` (``lora_weights.safetensors``:
the ``lora_A`` / ``lora_B`` tensors of a LoRA-wrapped model, as its fine-tuning script saves
them). ``run`` loads the checkpoint with ``VoxCPM2Model.from_local`` and runs the jobs; the flow
noise is recorded (every ``torch.randn`` of a generation: the CFM's per-patch noise) so the
test can inject it. Nothing here is imported by the project.
"""

from __future__ import annotations

import importlib.machinery
import json
import sys
import types
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _stub_torchaudio() -> None:
    """voxcpm imports torchaudio for its V1 model and denoiser only; the PyPI torchaudio is a CUDA
    build whose native library does not load beside CPU torch, and VoxCPM2 reads audio with
    librosa. A stub module lets the package import."""
    ta = types.ModuleType("torchaudio")
    ta.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
    sys.modules["torchaudio"] = ta


_stub_torchaudio()


def _save_tokenizer(d: Path) -> None:
    from tiny_tokenizer import build as build_tokenizer

    build_tokenizer().save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False, "legacy": False}))


def _randomize(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Decisive random weights: linears normal(0, 0.1), norms around 1, small biases; the VAE's
    weight-norm magnitudes near PyTorch's default conv scale, Snake alphas around 1."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "audio_vae" in name:
                if name.endswith("weight_g"):
                    p.copy_(0.6 * (1 + 0.1 * torch.randn(p.shape, generator=gen)))
                elif name.endswith("weight_v"):
                    p.copy_(torch.randn(p.shape, generator=gen))
                elif name.endswith("alpha") or name.endswith("scale_embed.weight"):
                    p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
                else:
                    p.copy_(0.05 * torch.randn(p.shape, generator=gen))
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def _new_model(config, path: Path, lora_config=None):
    from transformers import LlamaTokenizerFast

    from voxcpm.model.voxcpm2 import VoxCPM2Model
    from voxcpm.modules.audiovae import AudioVAEV2

    tok = LlamaTokenizerFast.from_pretrained(str(path))
    return VoxCPM2Model(config, tok, AudioVAEV2(config=config.audio_vae_config), lora_config, device="cpu")


def build(out: Path, spec: dict) -> None:
    from safetensors.torch import save_file

    from voxcpm.model.voxcpm2 import LoRAConfig, VoxCPMConfig

    gen = torch.Generator().manual_seed(spec.get("seed", 0))
    d = out / "base"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(spec["config"], indent=2))
    _save_tokenizer(d)
    config = VoxCPMConfig.model_validate(spec["config"])
    model = _new_model(config, d)
    _randomize(model, gen)
    state = model.state_dict()
    save_file({k: v.contiguous() for k, v in state.items() if not k.startswith("audio_vae.")},
              str(d / "model.safetensors"))
    save_file({k[len("audio_vae."):]: v.contiguous() for k, v in state.items() if k.startswith("audio_vae.")},
              str(d / "audiovae.safetensors"))
    lc = spec["lora"]
    lmodel = _new_model(VoxCPMConfig.model_validate(spec["config"]), d, LoRAConfig(**lc))
    with torch.no_grad():
        for name, p in lmodel.named_parameters():
            if "lora_" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    ld = out / "lora"
    ld.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in lmodel.state_dict().items() if "lora_" in k},
              str(ld / "lora_weights.safetensors"))


def _load(root: Path, lora: dict | None = None):
    from voxcpm.model.voxcpm2 import LoRAConfig, VoxCPM2Model

    model = VoxCPM2Model.from_local(str(root / "base"), optimize=False, device="cpu",
                                    lora_config=LoRAConfig(**lora) if lora else None)
    if lora:
        loaded, skipped = model.load_lora_weights(str(root / "lora"), device="cpu")
        if skipped or not loaded:
            raise RuntimeError(f"LoRA load: {len(loaded)} loaded, skipped {skipped[:5]}")
    return model


def _write_wav(path: Path, samples: list[float], sr: int) -> None:
    import soundfile as sf

    sf.write(str(path), np.asarray(samples, dtype=np.float32), sr, subtype="FLOAT")


def _generate(model, job: dict, work: Path) -> dict:
    cache = None
    out: dict = {}
    if job.get("ref_wav") or job.get("prompt_wav"):
        kw = {}
        if job.get("ref_wav"):
            _write_wav(work / "ref.wav", job["ref_wav"], 16000)
            kw["reference_wav_path"] = str(work / "ref.wav")
        if job.get("prompt_wav"):
            _write_wav(work / "prompt.wav", job["prompt_wav"], 16000)
            kw["prompt_wav_path"] = str(work / "prompt.wav")
            kw["prompt_text"] = job["prompt_text"]
        cache = model.build_prompt_cache(**kw)
        for k in ("ref_audio_feat", "audio_feat"):
            if k in cache:
                out[k] = cache[k].clone()
    noise: list[torch.Tensor] = []
    orig = torch.randn

    def spy(*args, **kwargs):
        z = orig(*args, **kwargs)
        noise.append(z.detach().clone())
        return z

    torch.manual_seed(job.get("seed", 0))
    torch.randn = spy
    try:
        wav, _, feat = model.generate_with_prompt_cache(
            target_text=job["text"], prompt_cache=cache, min_len=job["min_len"], max_len=job["max_len"],
            inference_timesteps=job["timesteps"], cfg_value=job["cfg"])
    finally:
        torch.randn = orig
    out.update(wav=wav[0].clone(), latents=feat.clone(), noise=torch.cat(noise, dim=0),
               text_ids=torch.tensor(model.text_tokenizer(job.get("prompt_text", "") + job["text"])),
               target_ids=torch.tensor(model.text_tokenizer(job["text"])))
    return out


def run(root: Path, jobs: dict, out: Path) -> None:
    torch.set_num_threads(1)
    work = out.parent
    results: dict = {}
    models: dict = {}
    for key, job in jobs.items():
        tag = "lora" if job.get("lora") else "base"
        if tag not in models:
            models[tag] = _load(root, job.get("lora"))
        model = models[tag]
        if job["kind"] == "generate":
            results[key] = _generate(model, job, work)
        elif job["kind"] == "tokenize":
            results[key] = {s: model.text_tokenizer(s) for s in job["texts"]}
        elif job["kind"] == "vae":
            z = torch.tensor(job["latents"], dtype=torch.float32)  # [D, T]
            with torch.no_grad():
                whole = model.audio_vae.decode(z[None])[0, 0].clone()
                wav = torch.tensor(job["wav"], dtype=torch.float32)
                enc = model.audio_vae.encode(wav[None], 16000)[0].clone()
            results[key] = {"whole": whole, "encoded": enc}
        else:
            raise ValueError(f"unknown job kind {job['kind']!r}")
    torch.save(results, out)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "build":
        build(Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text()))
    elif cmd == "run":
        run(Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text()), Path(sys.argv[4]))
    else:
        raise SystemExit(f"usage: {sys.argv[0]} build|run ...")
