"""Speaker encoder parity with qwen-tts: the x-vector of 24 kHz audio (mel in plain torch)."""

from __future__ import annotations

import torch
from tests.models.qwen3_tts.qwen3_fixtures import JOBS, load_ours


def test_xvector_equals_reference(ckpt_root, reference):
    """SpeakerEncoder.embed(wav) equals the reference's extract_speaker_embedding."""
    enc = load_ours(ckpt_root, "base").model.speaker_encoder
    ours = enc.embed(torch.tensor(JOBS["xvector"]["wav"]))
    ref = reference["xvector"]["xvector"]
    assert ours.shape == ref.shape == (64,)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def test_clone_xvector_equals_reference(ckpt_root, reference):
    """The x-vector used by the clone generation job is the one our encoder computes."""
    enc = load_ours(ckpt_root, "base").model.speaker_encoder
    ours = enc.embed(torch.tensor(JOBS["clone_dual"]["ref_wav"]))
    torch.testing.assert_close(ours, reference["clone_dual"]["xvector"], atol=1e-4, rtol=1e-4)


def test_custom_voice_checkpoint_has_no_speaker_encoder(ckpt_root):
    """A CustomVoice checkpoint cannot clone: no encoder, and the config says so."""
    loaded = load_ours(ckpt_root, "custom")
    assert loaded.model.speaker_encoder is None and not loaded.config.can_clone
