"""Talker + code predictor parity with qwen-tts: greedy generation token for token, RoPE."""

from __future__ import annotations

import pytest
import torch
from tests.models.orpheus.dense_attention import DenseAttention
from tests.models.qwen3_tts.qwen3_fixtures import GEN_JOBS, JOBS, greedy_generate, load_ours, our_prompt

from models.qwen3_tts.talker import apply_rope, rope_cos_sin


@pytest.mark.parametrize("key", sorted(GEN_JOBS))
def test_greedy_generation_equals_reference(ckpt_root, reference, key):
    """All 16 codebooks of every frame equal the reference's greedy generation, to its stop
    (eos on codebook 0, or its max_new_tokens - 1 complete frames)."""
    job, ref = GEN_JOBS[key], reference[key]
    loaded = load_ours(ckpt_root, job["checkpoint"])
    prompt, embeds = our_prompt(loaded, job, ref.get("xvector"))
    max_frames = job["max_new_tokens"] - 1
    ours = greedy_generate(loaded, prompt, embeds, max_frames, eos_scale=job.get("eos_scale"))
    assert ours.tolist() == ref["codes"].tolist()


def test_eos_job_stops_early():
    """The eos-heavy job really exercises the stop (and the 2-frame eos ban) in the reference."""
    assert JOBS["cv_stop"]["eos_scale"] and JOBS["cv_stop"]["max_new_tokens"] > 3


def test_stop_case_stopped_before_max(reference):
    """The reference stopped on eos in the eos-heavy job, not at max_new_tokens."""
    assert 2 <= len(reference["cv_stop"]["codes"]) < JOBS["cv_stop"]["max_new_tokens"] - 1


def test_plain_rope_equals_reference_multimodal_rope(ckpt_root, reference):
    """With equal position streams the reference's interleaved multimodal RoPE is plain RoPE."""
    ref = reference["mrope"]
    talker = load_ours(ckpt_root, "custom").model.talker
    pos = torch.tensor(JOBS["mrope"]["positions"])
    cos, sin = rope_cos_sin(pos, talker.inv_freq, torch.float32)  # [T, 1, D]
    q = apply_rope(ref["q"].transpose(0, 1), cos, sin).transpose(0, 1)  # [H, T, D]
    k = apply_rope(ref["k"].transpose(0, 1), cos, sin).transpose(0, 1)
    torch.testing.assert_close(q, ref["q_rot"], atol=1e-6, rtol=0)
    torch.testing.assert_close(k, ref["k_rot"], atol=1e-6, rtol=0)


def test_ragged_batch_equals_each_sequence_alone(ckpt_root):
    """A flattened batch (one sequence decoding beside another's prefill) gives each one's
    hidden states alone."""
    talker = load_ours(ckpt_root, "custom").model.talker
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(7, 64, generator=g), torch.randn(4, 64, generator=g)
    with torch.no_grad():
        solo = {}
        for name, x in (("a", a), ("b", b)):
            solo[name] = talker(x, torch.arange(len(x)), DenseAttention(2))
        att = DenseAttention(2)
        att.plan([0], [6])
        talker(a[:6], torch.arange(6), att)
        att.plan([0, 1], [1, 4])
        mixed = talker(torch.cat((a[6:], b)), torch.cat((torch.tensor([6]), torch.arange(4))), att)
    torch.testing.assert_close(mixed[0], solo["a"][6], atol=1e-5, rtol=0)
    torch.testing.assert_close(mixed[1:], solo["b"], atol=1e-5, rtol=0)


def test_decode_frame_batch_rows_are_independent(ckpt_root):
    """decode_frame on a batch equals each row alone (static shapes, no cross-row mixing)."""
    from models.qwen3_tts.code_predictor import code0_mask, decode_frame

    loaded = load_ours(ckpt_root, "custom")
    talker = loaded.model.talker
    allowed = code0_mask(loaded.config.talker)
    h = torch.randn(3, 64, generator=torch.Generator().manual_seed(6))

    def argmax(logits, salt):
        return logits.argmax(-1)

    with torch.no_grad():
        batch = decode_frame(talker, h, argmax, allowed=allowed, eos_ok=torch.tensor([True, False, True]))
        rows = [decode_frame(talker, h[i:i + 1], argmax, allowed=allowed, eos_ok=torch.tensor([i != 1]))
                for i in range(3)]
    assert batch.tolist() == torch.cat(rows).tolist()
    assert batch.shape == (3, 16)
    assert int(batch[:, 0].max()) < 2048 or int(batch[:, 0].max()) == loaded.config.talker.codec_eos_token_id


def test_decode_frame_writes_last_codes_and_slot_embedding_matches(ckpt_root):
    """decode_frame writes each row's codes into last_codes[slot]; embed_decode_slots reads them."""
    from models.qwen3_tts.code_predictor import code0_mask, decode_frame

    loaded = load_ours(ckpt_root, "custom")
    talker = loaded.model.talker
    last = torch.zeros(5, 16, dtype=torch.int64)
    slots = torch.tensor([3, 1])
    h = torch.randn(2, 64, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        codes = decode_frame(talker, h, lambda x, s: x.argmax(-1), allowed=code0_mask(loaded.config.talker),
                             slots=slots, last_codes=last)
        text = torch.tensor([151671, 151673])
        a = talker.embed_decode_slots(text, slots, last)
        b = talker.embed_decode(text, codes)
    assert last[3].tolist() == codes[0].tolist() and last[1].tolist() == codes[1].tolist()
    assert last[0].abs().sum() == 0
    torch.testing.assert_close(a, b)
