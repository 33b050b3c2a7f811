"""VoxCPM2 parity with voxcpm 2.0.3: tokens, prompt latents, generated latents and audio with the
reference's noise injected, zero-shot, cloned, continued and with a folded LoRA."""

from __future__ import annotations

import pytest
import torch
from tests.models.voxcpm2.voxcpm2_fixtures import (
    GEN_JOBS, JOBS, generate, injected, our_patches, our_prompt, to_vae,
)

REL = 1e-5


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _ours(request, key: str) -> tuple[object, dict]:
    job = GEN_JOBS[key]
    return request.getfixturevalue("ours_lora" if job.get("lora") else "ours"), job


def _run(loaded, job, ref) -> torch.Tensor:
    prompt, feats, cond = our_prompt(loaded, job)
    return generate(loaded, prompt, feats, noise=injected(ref["noise"]), seed=0, timesteps=job["timesteps"],
                    cfg=job["cfg"], min_len=job["min_len"], max_len=job["max_len"], cond=cond)


def test_tokenizer_equals_reference(ours, reference):
    """Our tokenizer (with the CJK character split) gives the reference's ids."""
    for text, ids in reference["tokenize"].items():
        assert ours.tokenizer.ids(text) == ids, text


def test_prompt_patches_equal_reference(ours, reference):
    """Reference and continuation audio encode (float32 VAE encoder, right / left padding) to the
    reference's prompt latents."""
    for key in ("clone", "continuation"):
        ref_p, cont_p = our_patches(ours, GEN_JOBS[key])
        got = ref_p if ref_p is not None else cont_p
        want = reference[key]["ref_audio_feat" if ref_p is not None else "audio_feat"]
        assert got.shape == want.shape
        assert _rel(got, want) < REL


@pytest.mark.parametrize("key", sorted(GEN_JOBS))
def test_latents_equal_reference(request, reference, key):
    """With the reference's noise, every generated patch equals the reference's, to its stop."""
    loaded, job = _ours(request, key)
    ref = reference[key]
    got = _run(loaded, job, ref)
    assert got.shape == ref["latents"].shape
    assert _rel(got, ref["latents"]) < REL


@pytest.mark.parametrize("key", sorted(GEN_JOBS))
def test_audio_equals_reference(request, reference, key):
    """Our latents decoded by our VAE (continuation: after the reference's 3 context patches,
    whose audio is cut) equal the reference's waveform."""
    loaded, job = _ours(request, key)
    ref = reference[key]
    lat = _run(loaded, job, ref)
    _, cont = our_patches(loaded, job)
    ctx = cont[-3:] if cont is not None else lat[:0]
    with torch.no_grad():
        wav = loaded.vae.decode(to_vae(torch.cat((ctx, lat))))[0][len(ctx) * loaded.config.patch_samples:]
    assert wav.shape == ref["wav"].shape
    assert float(ref["wav"].abs().max()) > 1e-2
    assert _rel(wav, ref["wav"]) < REL


def test_stop_rule_is_exercised(reference):
    """Some reference runs stopped on the stop head before max_len, none before min_len + 2."""
    lengths = {k: len(reference[k]["latents"]) for k in GEN_JOBS}
    assert any(lengths[k] < GEN_JOBS[k]["max_len"] for k in GEN_JOBS)
    assert all(lengths[k] >= GEN_JOBS[k]["min_len"] + 2 for k in GEN_JOBS)


def test_lora_changes_the_output(ours, reference):
    """The adapter matters: the base model with the LoRA job's noise does not give its latents."""
    job, ref = GEN_JOBS["lora"], reference["lora"]
    got = _run(ours, job, ref)
    n = min(len(got), len(ref["latents"]))
    assert _rel(got[:n], ref["latents"][:n]) > 1e-3


def test_vae_job_is_not_silent(reference):
    """The tiny VAE makes audible output, so decode comparisons are not vacuous."""
    assert float(reference["vae"]["whole"].std()) > 1e-3
    assert len(JOBS["vae"]["latents"][0]) * 1920 == len(reference["vae"]["whole"])
