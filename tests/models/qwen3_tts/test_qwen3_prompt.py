"""Prompt parity with qwen-tts: token ids, prompt embeddings and the text track, every mode."""

from __future__ import annotations

import pytest
import torch
from tests.models.qwen3_tts.qwen3_fixtures import GEN_JOBS, load_ours, our_prompt

ATOL = 1e-5


@pytest.mark.parametrize("key", sorted(GEN_JOBS))
def test_text_ids_equal_reference_tokenization(ckpt_root, reference, key):
    """Our text ids are the reference's [3:-5] of its assistant template; instructions whole."""
    job, ref = GEN_JOBS[key], reference[key]
    tok = load_ours(ckpt_root, job["checkpoint"]).tokenizer
    assert tok.role_ids == ref["input_ids"][:3].tolist()
    assert tok.text_ids(job["text"]) == ref["input_ids"][3:-5].tolist()
    if job.get("instruct"):
        assert tok.instruct_ids(job["instruct"]) == ref["instruct_ids"].tolist()


@pytest.mark.parametrize("key", sorted(GEN_JOBS))
def test_prompt_embeddings_equal_reference(ckpt_root, reference, key):
    """embed_prompt(build_prompt(...)) equals the talker's prompt input, position by position
    (custom voice with and without dialect, instruct, clone x-vector; dual track and non-streaming)."""
    job, ref = GEN_JOBS[key], reference[key]
    loaded = load_ours(ckpt_root, job["checkpoint"])
    _, embeds = our_prompt(loaded, job, ref.get("xvector"))
    assert embeds.shape == ref["inputs_embeds"].shape
    torch.testing.assert_close(embeds, ref["inputs_embeds"], atol=ATOL, rtol=0)


@pytest.mark.parametrize("key", sorted(GEN_JOBS))
def test_text_track_equals_reference_trailing_text(ckpt_root, reference, key):
    """The decode rows' text track (remaining text, tts_eos, then tts_pad) is the reference's."""
    job, ref = GEN_JOBS[key], reference[key]
    loaded = load_ours(ckpt_root, job["checkpoint"])
    prompt, _ = our_prompt(loaded, job, ref.get("xvector"))
    cfg, talker = loaded.config, loaded.model.talker
    ids = prompt.text_track + ([cfg.tts_eos_token_id] if prompt.eos_pending else [])
    with torch.no_grad():
        pad = talker.embed_text(torch.tensor([cfg.tts_pad_token_id]))[0]
        track = talker.embed_text(torch.tensor(ids, dtype=torch.int64)) if ids else pad[None]
    torch.testing.assert_close(track, ref["trailing_text_hidden"], atol=ATOL, rtol=0)
    torch.testing.assert_close(pad, ref["tts_pad_embed"], atol=ATOL, rtol=0)
