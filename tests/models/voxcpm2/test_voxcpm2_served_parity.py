"""The VoxCPM2 program served through the runtime (LMBackend, paged attention, the head in the
step, the streaming VAE in chunks) gives voxcpm 2.0.3's latents and audio with its noise
injected: zero-shot with two settings, a cloned voice, a continuation voice, a folded LoRA."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from tests.models.voxcpm2.voxcpm2_fixtures import GEN_JOBS, LORA, injected
from tests.models.voxcpm2.voxcpm2_serving import backend, run

REL = 1e-5


def _rel(a: Any, b: Any) -> float:
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture(scope="module")
def served(ckpt_root) -> Any:
    """The tiny checkpoint served (float32, chunks of 3 patches: every job ends mid-chunk or on a
    chunk boundary), its cloned voices registered from the reference jobs' audio."""
    b = backend(str(ckpt_root / "base"), load_format="auto", stream_chunk_patches=3, max_num_seqs=2)
    clone, cont = GEN_JOBS["clone"], GEN_JOBS["continuation"]
    b.program.add_voice("clone", sample_rate=16000, ref_wav=np.array(clone["ref_wav"], np.float32))
    b.program.add_voice("continuation", sample_rate=16000, prompt_wav=np.array(cont["prompt_wav"], np.float32),
                        prompt_text=cont["prompt_text"])
    return b


def _options(job: dict) -> dict:
    return {"inference_timesteps": job["timesteps"], "cfg_value": job["cfg"], "min_len": job["min_len"],
            "max_tokens": job["max_len"], "seed": job["seed"]}


def _serve(b: Any, key: str, ref: dict) -> tuple[torch.Tensor, np.ndarray]:
    job = GEN_JOBS[key]
    b.runner.head.noise = injected(ref["noise"])
    voice = key if key in ("clone", "continuation") else None
    return run(b, job["text"], _options(job), voice=voice)


@pytest.mark.parametrize("key", ["zero_shot", "zero_shot_settings", "clone", "continuation"])
def test_served_latents_and_audio_equal_the_reference(served, reference, key) -> None:
    """Every patch to the stop, and the streamed audio (a continuation's context audio cut), equal
    the reference's."""
    ref = reference[key]
    patches, wav = _serve(served, key, ref)
    assert patches.shape == ref["latents"].shape
    assert _rel(patches, ref["latents"]) < REL
    assert wav.shape == ref["wav"].shape and float(ref["wav"].abs().max()) > 1e-2
    assert _rel(wav, ref["wav"]) < REL


def test_served_lora_equals_the_reference_with_the_adapter(ckpt_root, reference) -> None:
    """``lora`` (the --lora setting) folds the reference-format adapter at load; served, it gives
    the reference's latents and audio with its LoRA layers."""
    b = backend(str(ckpt_root / "base"), load_format="auto", lora=str(ckpt_root / "lora"), lora_alpha=LORA["alpha"],
                max_num_seqs=1)
    ref = reference["lora"]
    patches, wav = _serve(b, "lora", ref)
    assert patches.shape == ref["latents"].shape and _rel(patches, ref["latents"]) < REL
    assert _rel(wav, ref["wav"]) < REL
