"""VoxCPM2 config presets and parsing, dummy loading, LoRA adapter validation."""

from __future__ import annotations

import json

import pytest
import torch

from models.voxcpm2.config import PRESETS, TINY, VOXCPM2, AudioVAEConfig, VoxCPM2Config
from models.voxcpm2.lora import fold_lora


def test_released_preset_numbers():
    """The voxcpm2 preset has the released geometry: 28 + 8 layers of 2048, 2 KV heads of 128,
    patches of 4 x 64 latents at 25 Hz (6.25 patches a second), 7,680 samples a patch at 48 kHz."""
    c = VOXCPM2
    assert (c.lm.num_hidden_layers, c.residual_lm_num_layers, c.lm.hidden_size) == (28, 8, 2048)
    assert (c.lm.num_attention_heads, c.lm.num_key_value_heads, c.lm.head_dim) == (16, 2, 128)
    assert c.lm.vocab_size == 73448 and not c.lm.use_mup and c.residual.no_rope
    assert (c.encoder_lm.head_dim, c.dit_lm.num_hidden_layers) == (128, 12)
    assert c.vae.sample_rate // c.vae.hop_length == 25
    assert c.patch_samples == 7680 and c.sample_rate == 48000 and c.vae.sr_bucket == 3


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_config_round_trips_through_config_json(name):
    """to_hf_dict -> json -> from_hf_dict gives the same config."""
    c = PRESETS[name]
    assert VoxCPM2Config.from_hf_dict(json.loads(json.dumps(c.to_hf_dict()))) == c


def test_bad_configs_are_refused():
    """Wrong architecture, a noisy VAE decoder, a LongRoPE table of the wrong width: ValueError."""
    d = TINY.to_hf_dict()
    with pytest.raises(ValueError, match="architecture"):
        VoxCPM2Config.from_hf_dict({**d, "architecture": "voxcpm"})
    with pytest.raises(ValueError, match="noise"):
        AudioVAEConfig(use_noise_block=True)
    bad = json.loads(json.dumps(d))
    bad["lm_config"]["rope_scaling"]["long_factor"] = [1.0]
    with pytest.raises(ValueError, match="long_factor"):
        VoxCPM2Config.from_hf_dict(bad)


def test_dummy_tiny_loads_and_steps():
    """--load-format dummy builds the tiny preset with finite outputs (the VAE is audible)."""
    from tests.models.orpheus.dense_attention import DenseAttention

    from models.voxcpm2.loader import load_voxcpm2

    loaded = load_voxcpm2("tiny", load_format="dummy", dtype=torch.float32)
    m = loaded.model
    with torch.no_grad():
        from models.voxcpm2.model import SlotFeatures

        m.slot_feats = SlotFeatures(1, 1, 4, 8, device="cpu")
        h = m(torch.tensor([5, 6, 101]), torch.arange(3), DenseAttention(m.num_layers), torch.zeros(3, dtype=torch.int64))
        wav = loaded.vae.decode(torch.randn(1, 8, 8))
    assert h.shape == (3, 128) and bool(h.isfinite().all())
    assert wav.shape == (1, 8 * 1920) and float(wav.std()) > 1e-3


def test_lora_adapter_is_validated():
    """Keys naming no linear, half pairs and wrong shapes are errors, not silently skipped."""
    lin = torch.nn.Sequential(torch.nn.Linear(4, 3))
    a, b = torch.ones(2, 4), torch.ones(3, 2)
    with pytest.raises(ValueError, match="not a linear"):
        fold_lora(lin, {"1.lora_A": a, "1.lora_B": b})
    with pytest.raises(ValueError, match="only"):
        fold_lora(lin, {"0.lora_A": a})
    with pytest.raises(ValueError, match="layer is"):
        fold_lora(lin, {"0.lora_A": torch.ones(2, 5), "0.lora_B": b})
    w = lin[0].weight.clone()
    assert fold_lora(lin, {"0.lora_A": a, "0.lora_B": b}, alpha=4.0) == ["0"]
    torch.testing.assert_close(lin[0].weight, w + 2.0 * (b @ a))
